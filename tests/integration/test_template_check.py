"""`klique template render --check` asks the real Slurm cluster, as the mapped account."""

import pytest
from click.testing import CliRunner
from helpers.estates import estate_yaml, profile

from broker.cli import main

pytestmark = pytest.mark.slurm

ALLOCATION = {"cpus": 1, "memory": "100M", "walltime": "10m"}


@pytest.fixture
def estate(tmp_path, slurm_cluster):
    path = tmp_path / "estate.yaml"
    pool = {
        "kind": "slurm",
        "partition": "debug",
        "job_root": str(slurm_cluster.work / "preview"),
        "user_map": {"alice": "alice"},
    }
    resources = {
        "cpu": profile("slurm", **ALLOCATION),
        "huge": profile("slurm", gpus=9, **ALLOCATION),
    }
    path.write_text(estate_yaml(resources=resources, pools={"slurm": pool}))
    return path


def render(*args):
    return CliRunner().invoke(main, ["template", "render", *args], catch_exceptions=False)


def test_check_reports_what_slurm_says(estate):
    result = render("--resource", "cpu", "--estate", str(estate), "--check")
    assert result.exit_code == 0, result.output
    assert "#SBATCH --job-name=klique-0" in result.stdout
    assert "# bash -n: ok" in result.stderr
    assert "sbatch --test-only: sbatch: Job" in result.stderr and "to start at" in result.stderr


def test_a_profile_slurm_cannot_satisfy_fails_the_check_in_slurms_words(estate):
    result = render("--resource", "huge", "--estate", str(estate), "--check")
    assert result.exit_code == 1
    assert "Requested node configuration is not available" in result.stderr


def test_an_unknown_resource_is_a_clear_error(estate):
    result = render("--resource", "nope", "--estate", str(estate))
    assert result.exit_code == 1
    assert "unknown compute resource 'nope'" in result.stderr
