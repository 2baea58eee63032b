"""`klique estate check` and a server that refuses an invalid estate."""

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from broker.cli import main

ROOT = Path(__file__).resolve().parents[2]
BAD = (
    "resources:\n  cpu:\n    profile: {pools: [local], cpus: many}\npools:\n  local: {kind: host}\n"
)


def test_check_accepts_the_example():
    result = CliRunner().invoke(
        main, ["estate", "check", "--file-only", str(ROOT / "examples" / "estate.yaml")]
    )
    assert result.exit_code == 0 and "ok (4 compute resources, 2 pools" in result.output


def test_check_lists_every_problem_and_exits_non_zero(tmp_path):
    path = tmp_path / "estate.yaml"
    path.write_text(BAD)
    result = CliRunner().invoke(main, ["estate", "check", str(path)])
    assert result.exit_code == 2
    assert result.output.startswith(f"{path}:3: resources.cpu.profile.cpus:")


def test_a_missing_file_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["estate", "check", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "cannot read the estate file" in result.output


def test_the_server_refuses_to_start_on_an_invalid_estate(tmp_path):
    path = tmp_path / "estate.yaml"
    path.write_text(BAD)
    env = {**os.environ, "KLIQUE_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "broker", "server", "--estate", str(path), "--port", "9"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"{path}:3: resources.cpu.profile.cpus:" in done.stderr
    assert not (tmp_path / "home" / "klique.db").exists()
