"""Batch templates: quoting, directives from the estate, errors that name file and line."""

import os
import re
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.cli import main
from broker.errors import TemplateError
from broker.estate import load_estate, parse_estate
from broker.preview import render_preview, sample_task
from broker.templates import BUILT_IN, TemplateFile, find_template, render, safe_directive

ROOT = Path(__file__).resolve().parents[2]
ESTATE = load_estate(ROOT / "examples" / "estate.yaml")


def script_for(estate, resource="1-gpu", **spec_changes):
    task = sample_task(estate, resource)
    task = replace(task, spec=replace(task.spec, **spec_changes))
    return render_preview(estate, task, None, check=False).script


def test_the_slurm_script_carries_the_profile_the_tag_and_the_estates_extra_directive():
    script = script_for(ESTATE)
    for line in (
        "#SBATCH --job-name=klique-0",
        "#SBATCH --comment=klique-0",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=research",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --mem=16384M",
        "#SBATCH --time=04:00:00",
        "#SBATCH --exclusive=user",
    ):
        assert line in script.splitlines(), line
    assert (
        "exec python3 -I -S /tmp/klique-jobs/klique-0/klique-runner.pyz /tmp/klique-jobs/klique-0"
        in script
    )


def test_skip_directives_drop_a_directive_and_gpus_flag_switches():
    text = (ROOT / "examples" / "estate.yaml").read_text()
    text = text.replace("skip_directives: []", "skip_directives: [--account]")
    text = text.replace("gpu_flag: gres", "gpu_flag: gpus")
    script = script_for(parse_estate(text, "e.yaml"))
    assert "--account=research" not in script
    assert "#SBATCH --gpus=1" in script and "--gres" not in script


def test_a_job_root_that_a_directive_cannot_carry_is_refused():
    text = (
        (ROOT / "examples" / "estate.yaml")
        .read_text()
        .replace("job_root: /tmp/klique-jobs", "job_root: '/tmp/klique jobs'")
    )
    with pytest.raises(TemplateError):  # the --output directive cannot carry a space
        script_for(parse_estate(text, "e.yaml"))


@pytest.mark.parametrize(
    "bad",
    [
        "--comment=$(id)",
        "--x=`id`",
        "--a;reboot",
        "--a\n#SBATCH -x",
        "--comment='x'",
        "--export=ALL,X=$HOME",
    ],
)
def test_hostile_directives_are_refused(bad):
    with pytest.raises(TemplateError, match="not allowed"):
        safe_directive(bad, "the estate")


@settings(max_examples=200, deadline=None)
@given(
    name=st.text(),
    args=st.lists(st.text(), max_size=4),
    env=st.dictionaries(
        st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True), st.text(), max_size=3
    ),
)
def test_free_text_never_changes_the_script(name, args, env):
    plain = script_for(ESTATE)
    assert script_for(ESTATE, name=name, command=("python", *args), env=env) == plain


def test_values_are_shell_quoted_unless_marked_safe(tmp_path):
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "default.sh.j2").write_text("echo {{ owner }} {{ owner|safe }}\n")
    out = render(
        TemplateFile("slurm/default.sh.j2", tmp_path / "slurm/default.sh.j2"),
        {"owner": "a b;$(x)"},
        (tmp_path,),
    )
    assert out == "echo 'a b;$(x)' a b;$(x)\n"


def test_template_lookup_order(tmp_path):
    (tmp_path / "slurm").mkdir()
    for name in ("default", "big", "1-gpu"):
        (tmp_path / "slurm" / f"{name}.sh.j2").write_text(name)
    roots = (tmp_path,)
    assert find_template("slurm", "1-gpu", "big", roots).name == "slurm/1-gpu.sh.j2"
    assert find_template("slurm", "cpu", "big", roots).name == "slurm/big.sh.j2"
    assert find_template("slurm", "cpu", None, roots).path == tmp_path / "slurm/default.sh.j2"


def test_a_template_error_names_the_file_and_line(tmp_path):
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "default.sh.j2").write_text("#!/bin/bash\n\necho {{ no_such_value }}\n")
    with pytest.raises(TemplateError) as err:
        render(
            TemplateFile("slurm/default.sh.j2", tmp_path / "slurm/default.sh.j2"), {}, (tmp_path,)
        )
    assert "slurm/default.sh.j2:3:" in str(err.value) and "no_such_value" in str(err.value)
    (tmp_path / "slurm" / "broken.sh.j2").write_text("ok\n{% for x in %}\n")
    with pytest.raises(TemplateError) as err:
        render(TemplateFile("slurm/broken.sh.j2", tmp_path / "slurm/broken.sh.j2"), {}, (tmp_path,))
    assert "broken.sh.j2:2:" in str(err.value)


def _pyxis_estate():
    text = (ROOT / "examples" / "estate.yaml").read_text()
    text = text.replace("# container_runtime: pyxis", "container_runtime: pyxis")
    return parse_estate(text, "e.yaml")


def test_a_pyxis_pool_starts_the_runner_inside_the_image():
    script = script_for(_pyxis_estate(), image="nvcr.io/nvidia/pytorch:24.01-py3")
    job = "/tmp/klique-jobs/klique-0"
    # The step asks for the allocation's CPUs: srun of Slurm 22.05 to 23.02 does not inherit
    # --cpus-per-task, and would give the runner one CPU.
    cpus = re.search(r"^#SBATCH --cpus-per-task=(\d+)$", script, re.M)
    assert cpus is not None and int(cpus[1]) > 1
    assert (
        f"KLIQUE_CONTAINER=pyxis exec srun --ntasks=1 '--container-image=nvcr.io#nvidia/pytorch:"
        f"24.01-py3' --container-mounts={job}:{job} --container-workdir={job} "
        f"--no-container-entrypoint --export=ALL --cpus-per-task={cpus[1]} python3 -I -S "
        f"{job}/klique-runner.pyz {job}"
    ) in script
    assert 'export NVIDIA_VISIBLE_DEVICES="${SLURM_JOB_GPUS:-void}"' in script
    assert f"exec python3 -I -S {job}/klique-runner.pyz" not in script  # never on the host as well
    assert "srun" not in script_for(_pyxis_estate())  # a task without an image runs as before


@pytest.mark.parametrize("bad", ["nvcr.io/x:$(id)", "a b", "img;reboot", "Img:1"])
def test_an_image_a_script_cannot_carry_is_refused(bad):
    from broker.errors import SubmitError

    with pytest.raises(SubmitError, match="not a valid reference"):
        script_for(_pyxis_estate(), image=bad)


def test_pyxis_on_a_pool_that_is_not_slurm_is_an_estate_error():
    from broker.errors import EstateError

    text = (ROOT / "examples" / "estate.yaml").read_text()
    text = text.replace("kind: host", "kind: host\n    container_runtime: pyxis", 1)
    with pytest.raises(EstateError, match="pyxis is a Slurm plugin"):
        parse_estate(text, "e.yaml")


def test_the_built_in_templates_are_the_checkouts_top_level_folder():
    # the editable checkout maps no `klique_templates` package: the fallback finds templates/
    assert BUILT_IN == ROOT / "templates"
    assert (BUILT_IN / "slurm" / "default.sh.j2").is_file()


def test_klique_template_render_prints_a_sites_template_before_the_built_in_one(tmp_path):
    site = tmp_path / "site"
    estate = tmp_path / "estate.yaml"
    text = (ROOT / "examples" / "estate.yaml").read_text()
    estate.write_text(text + f"templates_dir: {site}\n")
    argv = ["template", "render", "-r", "1-gpu", "--estate", str(estate)]
    built_in = CliRunner().invoke(main, argv, catch_exceptions=False)
    assert built_in.exit_code == 0, built_in.output
    assert "#SBATCH --gres=gpu:1" in built_in.stdout and "# the site's" not in built_in.stdout
    (site / "slurm").mkdir(parents=True)
    (site / "slurm" / "default.sh.j2").write_text(
        "#!/bin/bash\n# the site's default for {{ resource }}\n"
    )
    shown = CliRunner().invoke(main, argv, catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    assert shown.stdout == "#!/bin/bash\n# the site's default for 1-gpu\n"


def test_a_sites_templates_dir_is_searched_first_with_the_same_fallbacks(tmp_path):
    site = tmp_path / "site"
    (site / "slurm").mkdir(parents=True)
    (site / "partials").mkdir()
    text = (ROOT / "examples" / "estate.yaml").read_text() + f"templates_dir: {site}\n"
    # No site template yet: the built-in default.
    estate = parse_estate(text, "e.yaml")
    assert render_preview(estate, sample_task(estate, "1-gpu"), None, False).template == (
        BUILT_IN / "slurm" / "default.sh.j2"
    )
    # A site default, which includes a partial of the site's own over the built-in one.
    (site / "slurm" / "default.sh.j2").write_text(
        '#!/bin/bash\n# site template\n{% include "partials/run.sh.j2" %}\n'
    )
    (site / "partials" / "run.sh.j2").write_text("echo site partial for {{ task_id }}\n")
    estate = parse_estate(text, "e.yaml")
    preview = render_preview(estate, sample_task(estate, "1-gpu"), None, False)
    assert preview.template == site / "slurm" / "default.sh.j2"
    assert preview.script == "#!/bin/bash\n# site template\necho site partial for 0\n"
    # A resource's own template wins over the site's default.
    (site / "slurm" / "1-gpu.sh.j2").write_text("#!/bin/bash\n# just for 1-gpu\n")
    estate = parse_estate(text, "e.yaml")
    assert render_preview(estate, sample_task(estate, "1-gpu"), None, False).script == (
        "#!/bin/bash\n# just for 1-gpu\n"
    )


def test_a_checkpoint_signal_before_the_runner_has_its_handler_does_not_end_the_job(tmp_path):
    """The job's script runs; its `python3` (here a stand-in that waits, as the runner's
    start does) is sent USR1 and USR2 before it could set a handler: the job goes on."""
    text = (ROOT / "examples" / "estate.yaml").read_text()
    jobs = tmp_path / "jobs"
    (jobs / "klique-0").mkdir(parents=True)
    script = script_for(parse_estate(text.replace("/tmp/klique-jobs", str(jobs)), "e.yaml"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ready, release = tmp_path / "ready", tmp_path / "release"
    stand_in = bin_dir / "python3"
    stand_in.write_text(
        f"#!/bin/sh\ntouch {ready}\nwhile [ ! -e {release} ]; do sleep 0.05; done\nexit 7\n"
    )
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    job = subprocess.Popen(["bash", "-c", script], env=env)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert job.poll() is None and time.monotonic() < deadline, "the stand-in never ran"
            time.sleep(0.02)
        job.send_signal(signal.SIGUSR1)
        job.send_signal(signal.SIGUSR2)
        release.touch()
        assert job.wait(30) == 7  # its own exit, not the signal's
    finally:
        job.kill()
        job.wait()
