"""Spill-over end to end: the real Slurm pool first in the profile's order, and full."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    FINAL,
    HOST_ACCESS,
    Server,
    free_port,
    shared_folder,
    start_server,
    stop_server,
    wait_for,
)
from helpers.kube import NAMESPACE, Emulator
from helpers.slurm import SlurmJob, slurm_jobs

pytestmark = pytest.mark.slurm

JOB_PYTHON = "/usr/bin/python3"  # the test accounts cannot read the virtual environment's
TASKS = 6
MAX_QUEUED = 2
IN_SLURM = {"placed", "submitted", "pending", "running"}


def spill_estate(job_root: Path) -> str:
    return f"""
resources:
  1-gpu:
    profile: {{gpus: 1, cpus: 1, memory: 100M, walltime: 10m, pools: [slurm, local]}}
pools:
  slurm:
    kind: slurm
    partition: gpu
    job_root: {job_root}
    python: {JOB_PYTHON}
    poll_interval: 1s
    lost_after: 30s
    accounting: jobcomp
    max_queued: {MAX_QUEUED}
    max_wait: 5s
    user_map: {{alice: alice}}
  local:
    kind: host
    slots: 2
    gpus: 2
    {HOST_ACCESS.replace("$JOB_ROOT", str(job_root))}
"""


def squeue(*args: str) -> list[list[str]]:
    done = subprocess.run(
        ["squeue", "--noheader", *args], capture_output=True, text=True, check=True, timeout=60
    )
    return [line.split("|") for line in done.stdout.splitlines() if line.strip()]


@pytest.fixture
def full_gpu_partition(slurm_cluster: Any) -> Iterator[list[str]]:
    """Every fake GPU held by a long job of bob's, submitted outside Klique; cancelled after."""
    fillers: list[str] = []
    try:
        for _ in range(4):
            done = subprocess.run(
                [
                    "runuser",
                    "-u",
                    "bob",
                    "--",
                    "sbatch",
                    "--parsable",
                    "--partition=gpu",
                    "--gres=gpu:1",
                    "--time=5",  # bounded even if the clean-up below never runs
                    "--job-name=spill-filler",
                    "--output=/dev/null",
                    "--wrap",
                    "sleep 300",
                ],
                capture_output=True,
                text=True,
                cwd=slurm_cluster.work,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            fillers.append(done.stdout.strip().split(";")[0])

        def all_running() -> bool:
            states = squeue("--states=all", f"--jobs={','.join(fillers)}", "--format=%i|%T")
            return len(states) == 4 and all(state == "RUNNING" for _, state in states)

        wait_for(all_running, 180, "bob's four GPU jobs to run", interval=0.5)
        yield fillers
    finally:
        if fillers:
            subprocess.run(["scancel", *fillers], check=False, timeout=60)


@pytest.fixture
def spill_server(tmp_path: Path, slurm_cluster: Any) -> Iterator[tuple[Server, Path]]:
    job_root = slurm_cluster.work / f"spill-{os.getpid()}-{tmp_path.name}"
    job_root.mkdir(mode=0o1777)
    os.chmod(job_root, 0o1777)
    estate = tmp_path / "estate.yaml"
    estate.write_text(spill_estate(job_root))
    server = start_server(tmp_path / "home", estate)
    try:
        yield server, job_root
    finally:
        stop_server(server)
        ours = [job.native_id for job in our_jobs(job_root) if job.state in ("PENDING", "RUNNING")]
        if ours:
            subprocess.run(["scancel", *ours], check=False, timeout=60)
        shutil.rmtree(job_root, ignore_errors=True)


def our_jobs(job_root: Path) -> list[SlurmJob]:
    """Every job whose script lies under this test's job root."""
    return [job for jobs in slurm_jobs(job_root).values() for job in jobs]


def test_tasks_spill_from_a_full_slurm_pool_to_the_host_pool(
    full_gpu_partition: list[str], spill_server: tuple[Server, Path]
) -> None:
    server, job_root = spill_server
    with server.api(server.make_token("alice")) as api:
        ids = [
            api.post(
                "/tasks",
                json={"command": [JOB_PYTHON, "-c", "print('ran')"], "resource": "1-gpu"},
            ).json()["id"]
            for _ in range(TASKS)
        ]
        most_in_slurm = 0

        def all_final() -> bool:
            nonlocal most_in_slurm
            tasks = [t for t in api.get("/tasks").json() if t["id"] in ids]
            in_slurm = sum(1 for t in tasks if t["pool"] == "slurm" and t["state"] in IN_SLURM)
            most_in_slurm = max(most_in_slurm, in_slurm)
            return all(t["state"] in FINAL for t in tasks)

        try:
            wait_for(all_final, 180, f"all {TASKS} tasks to end", interval=0.2)
        finally:
            queue = our_jobs(job_root)
        shown = {i: api.get(f"/tasks/{i}").json() for i in ids}

    outcomes = [(t["state"], t["pool"]) for t in shown.values()]
    assert outcomes == [("completed", "local")] * TASKS, [
        (t["id"], t["state"], t["pool"], t["reason"]) for t in shown.values()
    ]
    assert most_in_slurm <= MAX_QUEUED

    spilled = {
        i: t
        for i, t in shown.items()
        if any("waited past max_wait in slurm" in e["reason"] for e in t["events"])
    }
    assert spilled, json.dumps(shown, indent=2)
    for task in spilled.values():
        states = [e["to"] for e in task["events"]]
        back = states.index("queued", 1)
        assert states[back - 1] in ("submitted", "pending"), states
        assert states[back:] == ["queued", "placed", "submitted", "running", "completed"], states

    # Slurm got jobs for the spilled tasks, and cancelled every one: none ran.
    names = {job.name for job in queue}
    assert {f"klique-{i}" for i in spilled} <= names, queue
    assert {job.state for job in queue} <= {"CANCELLED"}, queue
    running = squeue("--states=all", f"--jobs={','.join(full_gpu_partition)}", "--format=%T")
    assert running == [["RUNNING"]] * 4, "bob's GPU jobs ended early: Slurm was not kept full"


# One compute resource over a Slurm pool, a Kubernetes pool and a host pool in docker mode, in
# that order. Slurm's GPUs are all held and each queueing pool takes one waiting task: a sweep
# of three copies of one task lands one copy on each pool, in one placement cycle.
EVERYWHERE = """
resources:
  1-gpu:
    profile: {{gpus: 1, cpus: 1, memory: 400M, walltime: 10m, pools: [slurm, k8s, box]}}
pools:
  slurm:
    kind: slurm
    partition: gpu
    job_root: {slurm_root}
    python: {python}
    poll_interval: 1s
    accounting: jobcomp
    max_queued: 1
    user_map: {{alice: alice}}
  k8s:
    kind: kubernetes
    namespace: {namespace}
    server: {url}
    image: {image}
    run_as_user: {uid}
    delete_grace: 2s
    max_queued: 1
  box:
    kind: host
    slots: 1
    gpus: 1
    mode: docker
    runtime: podman
    image: {image}
    gpu_device: {gpu_device}
    run_args: {run_args}
    user_map: {{alice: alice}}
    job_root: {box_root}
"""
TRAIN = "import greeting\nprint('RESULT', greeting.TEXT, sum(i * i for i in range(1000)))\n"


@pytest.fixture
def code_server(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A checkout whose origin is served by `git daemon` on loopback (git's own protocol: the
    test image's git has no HTTP helper), with a change and a new file not committed."""
    served = shared_folder("klique-git-")
    checkout = tmp_path / "checkout"
    git = ["git", "-c", "user.email=a@example.com", "-c", "user.name=A", "-C", str(checkout)]
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    (checkout / "train.py").write_text("print('RESULT committed')\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(checkout), str(served / "code.git")], check=True
    )
    port = free_port()
    url = f"git://127.0.0.1:{port}/code.git"
    subprocess.run([*git, "remote", "add", "origin", url], check=True)
    (checkout / "train.py").write_text(TRAIN)
    (checkout / "greeting.py").write_text("TEXT = 'from the uncommitted diff'\n")
    daemon = subprocess.Popen(
        ["git", "daemon", "--reuseaddr", "--listen=127.0.0.1", f"--port={port}", "--export-all",
         f"--base-path={served}", str(served)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        probe = ["git", "ls-remote", url]
        wait_for(lambda: subprocess.run(probe, capture_output=True).returncode == 0, 30, "git")
        yield checkout, url
    finally:
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(served, ignore_errors=True)


@pytest.fixture
def everywhere_server(
    tmp_path: Path, slurm_cluster: Any, podman: Any
) -> Iterator[tuple[Server, Path]]:
    cluster = Emulator()
    slurm_root = slurm_cluster.work / f"everywhere-{os.getpid()}-{tmp_path.name}"
    slurm_root.mkdir(mode=0o1777)
    os.chmod(slurm_root, 0o1777)
    box_root = shared_folder("klique-jobs-")
    estate = tmp_path / "estate.yaml"
    estate.write_text(
        EVERYWHERE.format(
            slurm_root=slurm_root, python=JOB_PYTHON, namespace=NAMESPACE, url=cluster.url,
            image=podman.image, uid=pwd.getpwnam("alice").pw_uid, gpu_device=podman.gpu_device,
            run_args=json.dumps([*podman.run_args, "--network=host"]), box_root=box_root,
        )
    )  # fmt: skip
    server = start_server(tmp_path / "home", estate)
    try:
        yield server, slurm_root
    finally:
        stop_server(server)
        cluster.stop()
        ours = [
            job.native_id for job in our_jobs(slurm_root) if job.state in ("PENDING", "RUNNING")
        ]
        if ours:
            subprocess.run(["scancel", *ours], check=False, timeout=60)
        shutil.rmtree(slurm_root, ignore_errors=True)
        shutil.rmtree(box_root, ignore_errors=True)


@pytest.mark.podman
def test_one_task_spills_over_slurm_kubernetes_and_docker_mode_with_the_same_output(
    full_gpu_partition: list[str],
    everywhere_server: tuple[Server, Path],
    code_server: tuple[Path, str],
) -> None:
    server, slurm_root = everywhere_server
    checkout, url = code_server
    token = server.make_token("alice")
    with server.api(token) as api:

        def ready() -> bool:
            pools = {p["name"]: p for p in api.get("/pools").json()}
            held = pools["slurm"]["reachable"] and pools["slurm"]["free_gpus"] == 0
            return held and pools["k8s"]["reachable"] and pools["box"]["reachable"]

        wait_for(ready, 60, "Klique to see Slurm's GPUs all held and the other pools up")
    made = server.cli(
        "submit", "--resource", "1-gpu", "--grid", "copy=1,2,3", "--json", "--",
        "python3", "train.py", token=token, cwd=checkout,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    ids = [t["id"] for t in json.loads(made.output)["tasks"]]
    with server.api(token) as api:
        first = {i: api.get(f"/tasks/{i}").json() for i in ids}
        assert all(t["code"]["repo"] == url and t["code"]["diff_bytes"] for t in first.values())

        def placed() -> dict[int, str] | None:
            pools = {i: api.get(f"/tasks/{i}").json()["pool"] for i in ids}
            return pools if all(pools.values()) else None

        where = wait_for(placed, 60, "all three copies to be placed")
        assert [where[i] for i in ids] == ["slurm", "k8s", "box"], where
        for i in ids[1:]:  # the copies that spilled over run while Slurm stays full
            assert server.wait_state(i, timeout=120, token=token)["state"] == "completed"
        assert api.get(f"/tasks/{ids[0]}").json()["state"] in ("submitted", "pending")
    subprocess.run(["scancel", *full_gpu_partition], check=True, timeout=60)
    done = server.wait_state(ids[0], timeout=180, token=token)
    assert done["state"] == "completed", done

    outputs = {}
    for i in ids:
        logs = server.cli("logs", str(i), token=token).output
        outputs[where[i]] = [line for line in logs.splitlines() if line.startswith("RESULT")]
    expected = ["RESULT from the uncommitted diff 332833500"]
    assert outputs == {"slurm": expected, "k8s": expected, "box": expected}, outputs
    ran = {job.name for job in our_jobs(slurm_root) if job.state == "COMPLETED"}
    assert ran == {f"klique-{ids[0]}"}, our_jobs(slurm_root)
