"""Pyxis through a real Slurm job: the batch script the Slurm driver renders for a Pyxis pool is
submitted to the real cluster; its `srun --container-image` is the Pyxis simulator on PATH,
whose step runs in a real Slurm step and starts the runner inside the image."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.container_images import FAKES, add_python, busybox_rootfs, publish
from helpers.runner import console, read_json

from broker.estate import parse_estate
from broker.preview import driver_for, sample_task
from inside_job import container, zipapp

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(shutil.which("ch-run") is None, reason="needs ch-run"),
]

ESTATE = """
resources:
  2-gpu:
    profile: {{gpus: 2, cpus: 1, memory: 100M, walltime: 10m, pools: [gpu]}}
pools:
  gpu: {{kind: slurm, partition: gpu, job_root: {job_root}, container_runtime: pyxis,
        container_scratch: {scratch}, user_map: {{alice: alice}}}}
"""
# The Pyxis simulator reads its registry and the real srun from the submitting environment
# (KLIQUE_SIM_*): the job exports sbatch's whole environment, and sbatch starts here from this
# test's (Klique's own submit step would start it with the job's variables only).


def test_a_pyxis_task_runs_inside_its_image_in_a_real_slurm_job(slurm_cluster) -> None:
    root = Path(tempfile.mkdtemp(prefix="klique-pyxis-", dir="/var/tmp"))
    root.chmod(0o755)
    for shared in ("jobs", "cache", "scratch"):
        (root / shared).mkdir()
        (root / shared).chmod(0o1777)
    try:
        image = busybox_rootfs(root / "rootfs")
        add_python(image)
        registry = root / "registry"
        ref = publish(registry, "klique/py", "1", image, Env=[f"PATH={container.DEFAULT_PATH}"])
        estate = parse_estate(
            ESTATE.format(job_root=root / "jobs", scratch=root / "scratch"), "estate.yaml"
        )
        task = sample_task(estate, "2-gpu", "alice")
        task = replace(task, spec=replace(task.spec, image=ref, command=("gpu-probe",)))
        driver = driver_for(estate, "2-gpu", "gpu")
        job = Path(driver.new_job_dir(task))
        job.mkdir()
        (job / "job.sh").write_text(driver.render(task, str(job)))
        document = driver.task_document(task, "token")
        document.update(report=None, code=None, cache_dir=str(root / "cache"))
        (job / "task.json").write_text(json.dumps(document))
        zipapp.build(job / "klique-runner.pyz")
        shutil.chown(job, "alice")
        settings = {
            "PATH": f"{FAKES / 'pyxis'}:{os.environ['PATH']}",
            "SLURM_CONF": str(slurm_cluster.conf),
            "KLIQUE_SIM_SRUN": shutil.which("srun") or "/usr/bin/srun",
            "KLIQUE_SIM_REGISTRY": str(registry),
            "NVIDIA_VISIBLE_DEVICES": "all",  # the host's: the template's grant replaces it
        }
        submit = ["runuser", "-u", "alice", "--", "env"]
        submit += [f"{k}={v}" for k, v in settings.items()]
        done = subprocess.run(
            [*submit, "sbatch", "--wait", str(job / "job.sh")],
            cwd=job,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        output = "".join(p.read_text() for p in job.glob("slurm-*.out"))
        assert done.returncode == 0, (done.stderr, output, console(job))
        assert "pyxis: imported docker image: registry.example.org#klique/py:1" in output
        exit_file = read_json(job, "exit.json")
        assert exit_file["outcome"] == "completed", (exit_file, output)
        granted = console(job).splitlines()[-1]
        assert granted.startswith("gpus=") and len(granted[5:].split(",")) == 2, granted
    finally:
        shutil.rmtree(root, ignore_errors=True)
