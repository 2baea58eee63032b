"""A task in a real Charliecloud image (ch-run from charliecloud-runtime) sees only its GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from helpers.runner import REPO_ROOT, console, make_job, read_json, run_runner

_MISSING = shutil.which("ch-run") is None or shutil.which("busybox") is None
if _MISSING and os.environ.get("KLIQUE_REQUIRE_SERVICES") == "1":
    raise RuntimeError("ch-run and busybox are missing: run scripts/apt-deps")
pytestmark = pytest.mark.skipif(
    _MISSING, reason="needs ch-run (apt-get install charliecloud-runtime) and busybox-static"
)

SHOW = [
    "/bin/sh",
    "-c",
    'echo "cuda=[$CUDA_VISIBLE_DEVICES] nvidia=[$NVIDIA_VISIBLE_DEVICES]"; env; pwd',
]


def _cuda_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("cuda="))


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    dest = tmp_path_factory.mktemp("image") / "busybox"
    subprocess.run(
        [str(REPO_ROOT / "scripts" / "charliecloud-image"), str(dest)],
        check=True,
        capture_output=True,
    )
    return str(dest)


def test_a_charliecloud_task_sees_only_its_granted_gpus(tmp_path, image):
    job = make_job(tmp_path, command=SHOW, image=image, gpus=[1, 3], env={"MINE": "kept $HOME"})
    result = run_runner(job, CUDA_VISIBLE_DEVICES="0,1,2,3", HOST_ONLY_SECRET="leak")
    assert result.returncode == 0, console(job)
    out = console(job)
    assert _cuda_line(out) == "cuda=[1,3] nvidia=[1,3]"
    assert "has no libcuda" in out and "ch-fromhost --nvidia" in out  # the site's prerequisite
    assert "HOST_ONLY_SECRET" not in out  # the environment is cleaned
    assert "MINE=kept $HOME" in out  # the task's own values arrive verbatim
    assert "KLIQUE_JOB_DIR=/klique/job" in out and "KLIQUE_TASK_ID=7" in out
    assert out.splitlines()[-1] == "/klique/job"
    assert read_json(job, "exit.json")["outcome"] == "completed"


def test_a_charliecloud_task_under_slurm_sees_the_slurm_grant(tmp_path, image):
    job = make_job(tmp_path, command=SHOW, image=image, scheduler="slurm", gpus=None)
    # In a device cgroup: CUDA numbers the one granted GPU 0; the host calls it 2.
    run_runner(job, CUDA_VISIBLE_DEVICES="0", SLURM_JOB_GPUS="2", SLURM_STEP_GPUS="2")
    assert _cuda_line(console(job)) == "cuda=[0] nvidia=[2]"


def test_a_charliecloud_task_writes_into_the_job_directory(tmp_path, image):
    job = make_job(
        tmp_path, command=["/bin/sh", "-c", "echo inside > /klique/job/out.txt"], image=image
    )
    assert run_runner(job).returncode == 0, console(job)
    assert (job / "out.txt").read_text() == "inside\n"


def test_a_preempted_charliecloud_task_ends_preempted(tmp_path, image):
    import signal

    from conftest import wait_for
    from helpers.runner import start_runner

    job = make_job(tmp_path, command=["/bin/sh", "-c", "echo ready; exec sleep 60"], image=image)
    runner = start_runner(job, KLIQUE_PREEMPTED="1")
    wait_for(lambda: "ready" in console(job), what="the task to start")
    runner.send_signal(signal.SIGTERM)
    runner.wait(60)
    exit_file = read_json(job, "exit.json")
    assert exit_file["outcome"] == "preempted" and exit_file["signal"] == signal.SIGTERM
