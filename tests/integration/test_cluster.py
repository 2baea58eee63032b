"""The Slurm cluster of scripts/slurm-up works: jobs run as their user, fake GPUs, sacct -c."""

from __future__ import annotations

import asyncio
import pwd
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.transport import LocalTransport

pytestmark = pytest.mark.slurm

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


@pytest.fixture
def job_dir(slurm_cluster: Any) -> Iterator[Path]:
    path = Path(slurm_cluster.work) / f"test-cluster-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def submit(transport: LocalTransport, job_dir: Path, *options: str, script: str) -> str:
    """sbatch as alice; the job id."""
    await transport.make_dir(str(job_dir), account="alice")
    argv = ["sbatch", "--parsable", f"--output={job_dir}/%j.out", *options, "--wrap", script]
    done = await transport.run(argv, account="alice", timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


async def finished(transport: LocalTransport, job_id: str, timeout: float = 120) -> list[str]:
    """Poll `sacct -c` (the jobcomp file) until the job is recorded as finished: [state, exit]."""
    deadline = time.monotonic() + timeout
    argv = ["sacct", "-c", "-j", job_id, "-n", "-P", "-o", "jobid,state,exitcode"]
    while True:
        done = await transport.run(argv, account="alice", timeout=30)
        assert done.returncode == 0, done.stderr
        for line in done.stdout.splitlines():
            jid, state, exit_code = line.split("|")
            if jid == job_id and state in FINISHED:
                return [state, exit_code]
        if time.monotonic() > deadline:
            queue = await transport.run(["squeue", "-j", job_id, "-t", "all"], account="alice")
            raise AssertionError(f"job {job_id} not finished after {timeout:g} s:\n{queue.stdout}")
        await asyncio.sleep(0.2)


def test_a_job_submitted_through_runuser_runs_with_the_users_uid_and_gid(job_dir: Path) -> None:
    async def scenario() -> tuple[list[str], str]:
        transport = LocalTransport()
        job_id = await submit(transport, job_dir, script="id -u; id -g; id -un")
        state = await finished(transport, job_id)
        return state, (job_dir / f"{job_id}.out").read_text()

    state, output = asyncio.run(scenario())
    alice = pwd.getpwnam("alice")
    assert state == ["COMPLETED", "0:0"]
    assert output.split() == [str(alice.pw_uid), str(alice.pw_gid), "alice"]


def test_a_gpu_job_sees_the_gpus_it_asked_for(job_dir: Path) -> None:
    async def scenario() -> str:
        transport = LocalTransport()
        script = 'echo "$CUDA_VISIBLE_DEVICES|$SLURM_GPUS_ON_NODE"'
        job_id = await submit(transport, job_dir, "--partition=gpu", "--gres=gpu:2", script=script)
        assert await finished(transport, job_id) == ["COMPLETED", "0:0"]
        return (job_dir / f"{job_id}.out").read_text().strip()

    devices, count = asyncio.run(scenario()).split("|")
    ids = devices.split(",")
    assert count == "2"
    assert len(ids) == len(set(ids)) == 2 and all(i in {"0", "1", "2", "3"} for i in ids)


def test_sacct_c_reports_how_finished_jobs_ended(job_dir: Path) -> None:
    async def scenario() -> list[list[str]]:
        transport = LocalTransport()
        ok = await submit(transport, job_dir, script="true")
        failed = await submit(transport, job_dir, script="exit 3")
        return [await finished(transport, ok), await finished(transport, failed)]

    assert asyncio.run(scenario()) == [["COMPLETED", "0:0"], ["FAILED", "3:0"]]


def test_more_gpus_than_the_node_has_are_refused(job_dir: Path) -> None:
    async def scenario() -> tuple[int, str]:
        transport = LocalTransport()
        await transport.make_dir(str(job_dir), account="alice")
        argv = [
            "sbatch",
            "--parsable",
            "--gres=gpu:5",
            f"--output={job_dir}/%j.out",
            "--wrap",
            "true",
        ]
        done = await transport.run(argv, account="alice", timeout=60)
        return done.returncode, done.stderr

    code, stderr = asyncio.run(scenario())
    assert code != 0 and "Requested node configuration is not available" in stderr
