"""The example site template (examples/site/templates/slurm/default.sh.j2) used as it is, on a
real Slurm cluster (tests/conftest_services.py `multinode_slurm_cluster`, whose nodes have the
feature a100): account, QoS, constraint, whole nodes, failure mail to the owner's address,
modules where there are some, NCCL settings, a scratch folder per job, and the checkpoint
signal passed on to the task."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, start_server, stop_server, submitted_id, wait_for
from helpers.batch import (
    JOB_PYTHON,
    login_node,
    open_folder,
    pool_yaml,
    remove_tree,
    search_path,
    shared_folder,
)

pytestmark = pytest.mark.slurm

ESTATE = f"""
templates_dir: {ROOT / "examples/site/templates"}
mail_domain: example.org
resources:
  node:
    profile: {{cpus: 1, memory: 100M, walltime: 10m, pools: [batch]}}
    extra_directives: ["--constraint=a100"]
    checkpoint_signal: {{signal: USR1, before: 2m}}
pools:
"""

# Says what the template gave it, then waits for the checkpoint signal and ends well on it.
CHECKPOINTS = """
import os, signal, stat, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(True))
scratch = os.environ["TMPDIR"]
mode = stat.S_IMODE(os.stat(scratch).st_mode)
print(f"scratch {scratch} mode {mode:o} owner {os.stat(scratch).st_uid == os.getuid()}")
print(f"nccl {os.environ['NCCL_SOCKET_IFNAME']} {os.environ['TORCH_NCCL_ASYNC_ERROR_HANDLING']}")
print("ready", flush=True)
deadline = time.monotonic() + 120
while not got and time.monotonic() < deadline:
    time.sleep(0.1)
print("checkpoint saved" if got else "no checkpoint signal", flush=True)
sys.exit(0 if got else 1)
"""


def test_a_task_runs_through_the_site_template_and_gets_its_checkpoint_signal(
    multinode_slurm_cluster,
):
    cluster = multinode_slurm_cluster
    folder = shared_folder("klique-site-template-")
    job_root = open_folder(cluster.work / f"jobs-{folder.name}")
    estate = folder / "estate.yaml"
    estate.write_text(
        ESTATE + pool_yaml("slurm", job_root, None, account="ml-research", qos="normal")
    )
    env = {"PATH": search_path(login_node(folder, "slurm", None)), "SLURM_CONF": str(cluster.conf)}
    server = start_server(folder / "home", estate, env)
    try:
        token = server.make_token("alice")
        args = ("submit", "--no-code", "--json", "-r", "node", "--", JOB_PYTHON, "-c", CHECKPOINTS)
        task_id = submitted_id(server.cli(*args, token=token))
        task = server.wait_state(task_id, {"running"}, timeout=90, token=token)

        def console() -> str:
            return server.cli("logs", str(task_id), token=token).output

        wait_for(lambda: "ready" in console(), 60, "the task to start")
        job = subprocess.run(
            ["scontrol", "show", "job", str(task["native_id"])],
            capture_output=True,
            text=True,
            check=True,
            env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(cluster.conf)},
        ).stdout
        for field in (
            "Account=ml-research",
            "Features=a100",
            "OverSubscribe=NO",  # --exclusive
            "MailUser=alice@example.org",
            "MailType=FAIL",
        ):
            assert field in job, job
        script = (job_root / task["job_dir"].rsplit("/", 1)[1] / "job.sh").read_text()
        assert "#SBATCH --signal=B:USR1@120" in script and "#SBATCH --qos=normal" in script
        # What Slurm sends 2 minutes before the walltime, sent now: to the batch shell, which
        # is the runner; it passes it on to the task.
        subprocess.run(
            ["scancel", "--batch", "--signal=USR1", str(task["native_id"])],
            check=True,
            env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(cluster.conf)},
        )
        task = server.wait_state(task_id, {"completed", "failed"}, timeout=60, token=token)
        assert task["state"] == "completed", (task, console())
        text = console()
        assert "checkpoint saved" in text, text
        assert "mode 700 owner True" in text and "/klique-job-" in text, text
        assert "nccl ^lo,docker0 1" in text, text
        scratch = text.split("scratch ", 1)[1].split(" ", 1)[0]
        remove_tree(Path(scratch))  # the site's epilog's work
    finally:
        stop_server(server)
        remove_tree(job_root)
        remove_tree(folder)
