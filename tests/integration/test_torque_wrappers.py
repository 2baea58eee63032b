"""The PBS driver's Torque dialect against Debian's slurm-wlm-torque wrappers: their real qsub,
qstat and qdel over the real Slurm cluster of scripts/slurm-up.

What the wrappers allow (the scenarios of test_batch_pools.py imported below run here unchanged):
qsub hands the script to sbatch, which reads the #PBS lines itself (-N, -l nodes=1:ppn=C:gpus=G,
-l mem, -l walltime), so the job is named klique-<id>, gets its CPUs, GPUs (CUDA_VISIBLE_DEVICES
and SLURM_JOB_GPUS), memory and time limit, and runs as the mapped account; qsub prints the bare
Slurm job id; `qstat -f -1 <ids>` lists those jobs; qdel cancels; both transports work.

What they do not allow (pinned by the last test):
- `#PBS -o` and `-j oe` are overridden: qsub always gives sbatch `-o job.sh.o<id>` and
  `-e job.sh.e<id>`, relative to the submitting account's working directory (its home), so the
  job's output is not in its job directory.
- `qstat -f` prints no exit_status and shows every ended Slurm state (completed, failed,
  cancelled, timeout, node failure) as C. The exit file decides; where it cannot, as for a
  walltime overrun (the runner records only the SIGTERM), the task ends cancelled rather than
  timeout, so the walltime scenario is not run here.
- qdel sends SIGKILL at once (no SIGTERM first): the runner writes no exit file.
- The job sees Slurm's environment, not Torque's: PBS_JOBID, PBS_O_WORKDIR and PBS_GPUFILE are
  unset.
- qstat shows ended jobs only for Slurm's MinJobAge; after that `qstat -f <id>` prints nothing
  and exits 153, which the driver reads as "left the queue" (then the exit file decides).
- qsub runs sbatch through a shell command line built from its arguments: a script path with
  spaces or shell characters would break it (Klique's job paths are checked names).
- Job arrays: qsub turns -t into sbatch --array but prints Slurm's bare job id, and qstat takes
  no -t, so the pool here sets `job_arrays: false`.

Needs the Debian package slurm-wlm-torque.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from conftest import start_server, stop_server
from helpers.batch import SSHLogin, open_folder, remove_tree, run_as, shared_folder
from test_batch_pools import (  # noqa: F401 - collected here, against the wrappers' pool
    BatchPool,
    estate,
    test_a_failing_command_fails_with_its_exit_code,
    test_a_gpu_task_sees_exactly_the_gpus_the_scheduler_gave_it,
    test_a_profile_the_scheduler_cannot_satisfy_is_refused_in_its_words,
    test_a_task_runs_as_the_users_own_account,
    test_an_unmapped_user_is_refused_with_a_reason,
    test_cancel_ends_cancelled_and_the_job_leaves_the_queue,
    test_hostile_strings_reach_the_job_byte_for_byte,
)

from broker.pools.pbs_parse import qstat_text_jobs

pytestmark = pytest.mark.slurm
WRAPPERS = ("qsub", "qstat", "qdel")
HOMES = {account: Path(os.path.expanduser(f"~{account}")) for account in ("alice", "bob")}


def wrappers_installed() -> bool:
    found = [shutil.which(program) for program in WRAPPERS]
    return all(path and Path(path).read_bytes().startswith(b"#! /usr/bin/perl") for path in found)


@pytest.fixture(
    scope="module", params=["local", pytest.param("ssh", marks=pytest.mark.ssh)], ids=str
)
def pool(request: Any, slurm_cluster: Any, test_users: Any) -> Iterator[BatchPool]:
    if not wrappers_installed():
        pytest.skip("the slurm-wlm-torque wrappers are not installed (apt-get install it)")
    folder = shared_folder(f"klique-torque-wrappers-{request.param}-")
    with ExitStack() as stack:
        stack.callback(remove_tree, folder)
        job_root = open_folder(slurm_cluster.work / f"jobs-{folder.name}")
        stack.callback(remove_tree, job_root)
        endpoint = None
        if request.param == "ssh":
            shared = request.getfixturevalue("sshd")
            endpoint = SSHLogin(shared.port, shared.known_hosts, shared.client_key)
        estate_file = folder / "estate.yaml"
        # The wrappers' qsub prints Slurm's bare id for an array and their qstat has no -t:
        # such a pool turns job arrays off (docs/job-arrays.md, Torque).
        estate_file.write_text(estate("torque", job_root, endpoint, {"job_arrays": False}))
        server = start_server(folder / "home", estate_file)
        stack.callback(stop_server, server)
        stack.callback(remove_outputs, server)
        tokens = {u: server.make_token(u) for u in ("alice", "bob", "mallory")}
        slurm = "Requested node configuration is not available"
        yield BatchPool(server, "torque", os.environ["PATH"], r"\d+", slurm, request.param, tokens)


def remove_outputs(server: Any) -> None:
    """The job.sh.o<id> and job.sh.e<id> files qsub had sbatch write into the accounts' homes."""
    with server.api() as api:
        tasks = api.get("/tasks", params={"all_users": True, "limit": 1000}).json()
    for task in tasks:
        for home in HOMES.values():
            for stream in "oe":
                path = home / f"job.sh.{stream}{task['native_id']}"
                if task["native_id"] and path.exists():
                    path.unlink()


def test_what_the_wrappers_leave_out(pool: BatchPool) -> None:
    report = (
        "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
        "('PBS_JOBID', 'PBS_O_WORKDIR', 'SLURM_JOB_ID', 'SLURM_JOB_NAME')}))"
    )
    task_id = pool.submit("alice", "--", "/usr/bin/python3", "-c", report)
    task = pool.wait(task_id, "alice")
    assert task["state"] == "completed", task
    native_id = task["native_id"]
    assert pool.output(task_id, "alice") == {
        "PBS_JOBID": None,
        "PBS_O_WORKDIR": None,
        "SLURM_JOB_ID": native_id,
        "SLURM_JOB_NAME": f"klique-{task_id}",
    }
    # Ended: C, and no exit status to tell how.
    listed = run_as("alice", ["qstat", "-f", "-1", native_id], pool.path).stdout
    jobs = dict(qstat_text_jobs(listed))
    assert jobs[native_id]["job_state"] == "C"
    assert "exit_status" not in jobs[native_id]
    # The output went to the account's home, not to the #PBS -o path in the job directory.
    assert (HOMES["alice"] / f"job.sh.o{native_id}").exists()
    assert not Path(task["job_dir"], "pbs.out").exists()
