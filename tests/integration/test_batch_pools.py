"""The batch pools end to end: each scenario is one test body, run on the real Slurm cluster of
scripts/slurm-up and on the PBS Professional, Torque and LSF simulators, over both transports,
with each simulator's server settings at the vendor's defaults and at the common other values."""

from __future__ import annotations

import json
import os
import pwd
import re
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import Server, start_server, stop_server, submitted_id, wait_for
from helpers.batch import (
    JOB_PYTHON,
    SSHLogin,
    batch_pool,
    count_lines,
    login_node,
    open_folder,
    remove_tree,
    run_as,
    search_path,
    shared_folder,
    sshd_serving,
)
from helpers.estates import estate_yaml, profile

from broker.pools.lsf import LSF_ALL_STATES, parse_bjobs_json
from broker.pools.pbs_parse import (
    PBS_ALL_STATES,
    TORQUE_EXEC_CODES,
    parse_qstat_json,
    parse_qstat_text,
)


@dataclass(frozen=True)
class Site:
    """A scheduler as a site runs it: the transport, the simulator's server settings (none:
    the vendor's defaults, tests/fakes/README.md) and the pool's own settings."""

    scheduler: str
    transport: str
    server: Mapping[str, str] = field(default_factory=dict)
    pool: Mapping[str, Any] = field(default_factory=dict)


# PBS Professional with job history kept, the JOB_EXEC_KILL_WALLTIME code; and an older one
# (walltime kills report the job's own status) that hides other users' jobs.
PBS_HISTORY = {"KLIQUE_SIM_JOB_HISTORY_ENABLE": "true"}
PBS_2020 = {**PBS_HISTORY, "KLIQUE_SIM_PBS_VERSION": "19.1.3", "KLIQUE_SIM_QUERY_OTHER_JOBS": "0"}
TORQUE_OPEN = {"KLIQUE_SIM_QUERY_OTHER_JOBS": "true"}
LSF_STRICT = {"KLIQUE_SIM_BJOBS_CONSISTENT_EXIT_CODE": "Y"}
SSH = pytest.mark.ssh
CASES = [
    pytest.param(Site("slurm", "local"), marks=pytest.mark.slurm, id="slurm-local"),
    pytest.param(Site("slurm", "ssh"), marks=[pytest.mark.slurm, SSH], id="slurm-ssh"),
    pytest.param(Site("pbspro", "local"), id="pbspro-local"),
    pytest.param(Site("pbspro", "ssh"), marks=SSH, id="pbspro-ssh"),
    pytest.param(Site("pbspro", "local", PBS_HISTORY), id="pbspro-history-local"),
    pytest.param(Site("pbspro", "local", PBS_2020), id="pbspro-2020-private-local"),
    pytest.param(Site("torque", "local"), id="torque-local"),
    pytest.param(Site("torque", "ssh"), marks=SSH, id="torque-ssh"),
    pytest.param(Site("torque", "local", TORQUE_OPEN), id="torque-query-others-local"),
    pytest.param(Site("lsf", "local"), id="lsf-local"),
    pytest.param(Site("lsf", "ssh"), marks=SSH, id="lsf-ssh"),
    pytest.param(
        Site("lsf", "local", LSF_STRICT, {"bjobs_json": False}), id="lsf-strict-text-local"
    ),
]
NATIVE_ID = {
    "slurm": r"\d+",
    "pbspro": r"\d+\.[\w.-]+",
    "torque": r"\d+\.[\w.-]+",
    "lsf": r"\d+",
}
# What each scheduler says when no node could ever hold the job (9 GPUs; every one has 4).
REFUSAL = {
    "slurm": "Requested node configuration is not available",
    "pbspro": "Job violates queue and/or server resource limits",
    "torque": "Job exceeds queue resource limits",
    "lsf": "Job requirements for reserving resources exceed the cluster",
}
REPORT = (
    "import json, os, sys; gpufile = os.environ.get('PBS_GPUFILE'); "
    "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'argv': sys.argv[1:], "
    "'env': {k: v for k, v in os.environ.items() if k.startswith('HOSTILE') "
    "or k in ('CUDA_VISIBLE_DEVICES', 'SLURM_JOB_GPUS')}, "
    "'gpufile': open(gpufile).read().split() if gpufile else None}))"
)
HOSTILE = [
    'it\'s "quoted"',
    "$(touch /tmp/klique-pwned)",
    "`touch /tmp/klique-pwned`",
    "line one\nline two",
    "#SBATCH --uid=0",
    "#PBS -l select=99",
    "#BSUB -q hostile",
    "; rm -rf / ;",
    "\\\\ \t tab",
    "ünïcødé ✓",
]


def estate(
    scheduler: str,
    job_root: Any,
    endpoint: SSHLogin | None,
    pool: Mapping[str, Any] | None = None,
) -> str:
    """One pool `batch` of the scheduler; a compute resource for each scenario on it."""
    allocation = {"cpus": 1, "memory": "100M"}
    return estate_yaml(
        teams={"vision": ["alice"], "nlp": ["bob", "mallory"]},
        resources={
            "cpu": profile("batch", **allocation, walltime="10m"),
            "2-gpu": profile("batch", gpus=2, **allocation, walltime="10m"),
            "short": profile("batch", **allocation, walltime="5s"),
            "huge": profile("batch", gpus=9, **allocation, walltime="10m"),
        },
        pools={"batch": batch_pool(scheduler, job_root, endpoint, **(pool or {}))},
    )


@dataclass
class BatchPool:
    """A running server with one pool named `batch`, and what its scheduler is expected to say."""

    server: Server
    scheduler: str  # slurm, pbspro, torque or lsf: how its status command is read
    path: str  # PATH with the scheduler's commands, as the pool's accounts see it
    native_id: str  # a pattern for the scheduler's job ids
    refusal: str  # its words for a job no node can hold
    transport: str
    tokens: dict[str, str] = field(default_factory=dict)

    def skip_slurm_over_ssh(self) -> None:
        """Slurm ends a job at its walltime whichever transport submitted it, and no sooner than
        a minute (its limits are whole minutes): such a scenario runs on the local case alone."""
        if (self.scheduler, self.transport) == ("slurm", "ssh"):
            pytest.skip("Slurm's walltime is the same over SSH; run on slurm-local")

    def submit(self, user: str, *args: str) -> int:
        cli = ["submit", "--no-code", "--json", *args]
        return submitted_id(self.server.cli(*cli, token=self.tokens[user]))

    def wait(self, task_id: int, user: str, states: set[str] | None = None) -> dict[str, Any]:
        return self.server.wait_state(task_id, states, timeout=150, token=self.tokens[user])

    def output(self, task_id: int, user: str) -> dict[str, Any]:
        logs = self.server.cli("logs", str(task_id), token=self.tokens[user]).output
        return json.loads(logs.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=CASES)
def pool(request: Any, test_users: Any) -> Iterator[BatchPool]:
    site: Site = request.param
    scheduler, transport = site.scheduler, site.transport
    folder = shared_folder(f"klique-{scheduler}-{transport}-")
    with ExitStack() as stack:
        stack.callback(remove_tree, folder)
        if scheduler == "slurm":
            cluster = request.getfixturevalue("slurm_cluster")
            job_root = open_folder(cluster.work / f"jobs-{folder.name}")
            stack.callback(remove_tree, job_root)
            path = os.environ["PATH"]
        else:
            job_root = open_folder(folder / "jobs")
            sim = open_folder(folder / "sim")
            path = search_path(login_node(folder, scheduler, sim, settings=site.server))
        endpoint = None
        if transport == "ssh":
            shared = request.getfixturevalue("sshd")
            endpoint = (
                SSHLogin(shared.port, shared.known_hosts, shared.client_key)
                if scheduler == "slurm"
                else stack.enter_context(sshd_serving(folder, shared, path))
            )
        estate_file = folder / "estate.yaml"
        estate_file.write_text(estate(scheduler, job_root, endpoint, site.pool))
        server = start_server(folder / "home", estate_file, {"PATH": path})
        stack.callback(stop_server, server)
        tokens = {u: server.make_token(u) for u in ("alice", "bob", "mallory")}
        yield BatchPool(
            server, scheduler, path, NATIVE_ID[scheduler], REFUSAL[scheduler], transport, tokens
        )


def native_final(pool: BatchPool, native_id: str) -> bool:
    """The scheduler shows the job as ended (Slurm, and PBS Professional without job history
    or without -x: or no longer at all)."""
    status = {
        "slurm": ["squeue", "--noheader", "--states=all", f"--jobs={native_id}", "--format=%T"],
        "pbspro": ["qstat", "-f", "-F", "json", native_id],
        "torque": ["qstat", "-f", "-1", native_id],
        "lsf": ["bjobs", "-a", "-o", "jobid stat exit_code exit_reason", "-json", native_id],
    }[pool.scheduler]
    done = run_as("alice", status, pool.path)
    out = done.stdout
    if pool.scheduler == "slurm":
        return out.strip() in ("", "CANCELLED")
    if pool.scheduler == "pbspro" and done.returncode in (35, 153):  # finished, or forgotten
        return True
    if pool.scheduler == "lsf":
        jobs = parse_bjobs_json(out)
        return bool(jobs) and all(LSF_ALL_STATES[j.state].final for j in jobs)
    if pool.scheduler == "torque":
        jobs = parse_qstat_text(out, TORQUE_EXEC_CODES)
    else:
        jobs = parse_qstat_json(out)
    return bool(jobs) and all(PBS_ALL_STATES[j.state].final for j in jobs)


@pytest.mark.parametrize("user", ["alice", "bob"])
def test_a_task_runs_as_the_users_own_account(pool: BatchPool, user: str) -> None:
    task_id = pool.submit(user, "--", JOB_PYTHON, "-c", REPORT)
    task = pool.wait(task_id, user)
    assert task["state"] == "completed", task
    account = pwd.getpwnam(user)
    seen = pool.output(task_id, user)
    assert (seen["uid"], seen["gid"]) == (account.pw_uid, account.pw_gid)
    assert re.fullmatch(pool.native_id, task["native_id"]), task


def test_an_unmapped_user_is_refused_with_a_reason(pool: BatchPool) -> None:
    task_id = pool.submit("mallory", "--", "true")
    task = pool.wait(task_id, "mallory")
    assert task["state"] == "failed" and task["native_id"] is None
    assert "user mallory " in task["reason"] and "user_map" in task["reason"]


def test_a_gpu_task_sees_exactly_the_gpus_the_scheduler_gave_it(pool: BatchPool) -> None:
    task_id = pool.submit("alice", "-r", "2-gpu", "--", JOB_PYTHON, "-c", REPORT)
    task = pool.wait(task_id, "alice")
    assert task["state"] == "completed", task
    seen = pool.output(task_id, "alice")
    visible = seen["env"]["CUDA_VISIBLE_DEVICES"].split(",")
    assert len(visible) == 2
    named = granted_gpus(seen)
    assert named is None or visible == named


def granted_gpus(seen: dict[str, Any]) -> list[str] | None:
    """The GPUs the scheduler names apart from CUDA_VISIBLE_DEVICES: Slurm's SLURM_JOB_GPUS,
    Torque's PBS_GPUFILE (`<host>-gpu<N>` lines); None where it names none (PBS Pro, LSF)."""
    if "SLURM_JOB_GPUS" in seen["env"]:
        return seen["env"]["SLURM_JOB_GPUS"].split(",")
    if seen["gpufile"]:
        return [line.rpartition("-gpu")[2] for line in seen["gpufile"]]
    return None


def test_a_failing_command_fails_with_its_exit_code(pool: BatchPool) -> None:
    task_id = pool.submit("bob", "--", JOB_PYTHON, "-c", "raise SystemExit(7)")
    task = pool.wait(task_id, "bob")
    assert (task["state"], task["exit_code"]) == ("failed", 7)


def test_cancel_ends_cancelled_and_the_job_leaves_the_queue(pool: BatchPool) -> None:
    task_id = pool.submit("alice", "--", "sleep", "600")
    task = pool.wait(task_id, "alice", {"running"})
    assert pool.server.cli("cancel", str(task_id), token=pool.tokens["alice"]).exit_code == 0
    assert pool.server.task(task_id, pool.tokens["alice"])["state"] == "cancelled"
    native_id = task["native_id"]
    wait_for(lambda: native_final(pool, native_id), 60, f"job {native_id} to leave the queue")


def test_a_profile_the_scheduler_cannot_satisfy_is_refused_in_its_words(pool: BatchPool) -> None:
    task_id = pool.submit("alice", "-r", "huge", "--", "true")
    task = pool.wait(task_id, "alice")
    assert task["state"] == "failed"
    assert pool.refusal in task["reason"], task


def test_hostile_strings_reach_the_job_byte_for_byte(pool: BatchPool) -> None:
    env = {f"HOSTILE_{i}": s for i, s in enumerate(HOSTILE)}
    with pool.server.api(pool.tokens["bob"]) as api:
        task = api.post(
            "/tasks",
            json={
                "command": [JOB_PYTHON, "-c", REPORT, *HOSTILE],
                "name": HOSTILE[4] + HOSTILE[1],
                "env": env,
            },
        ).json()
    done = pool.wait(task["id"], "bob")
    assert done["state"] == "completed", done
    seen = pool.output(task["id"], "bob")
    assert seen["argv"] == HOSTILE
    assert {k: v for k, v in seen["env"].items() if k.startswith("HOSTILE")} == env
    assert not os.path.exists("/tmp/klique-pwned")
    with open(os.path.join(done["job_dir"], "job.sh")) as f:
        script = f.read()
    assert all(s not in script for s in HOSTILE)


def test_a_walltime_overrun_ends_timeout(pool: BatchPool) -> None:
    pool.skip_slurm_over_ssh()
    task_id = pool.submit("alice", "-r", "short", "--", "sleep", "600")
    task = pool.wait(task_id, "alice")
    assert task["state"] == "timeout", task
    assert "walltime" in task["reason"]


# Traps the walltime signals (SIGTERM; LSF's SIGUSR2, then its kill's SIGINT), says so, and
# then exits at once or carries on until the scheduler kills it.
TOLD = (
    "import signal, sys, time\n"
    "def told(signum, frame):\n"
    "    print('told', signal.Signals(signum).name, flush=True)\n"
    "    if sys.argv[1] == 'exits':\n"
    "        sys.exit(0)\n"
    "for name in ('SIGTERM', 'SIGUSR2', 'SIGINT'):\n"
    "    signal.signal(getattr(signal, name), told)\n"
    "while True:\n"
    "    time.sleep(0.1)\n"
)


@pytest.mark.parametrize("after", ["exits", "carries-on"])
def test_a_task_told_of_its_walltime_ends_timeout(pool: BatchPool, after: str) -> None:
    """The scheduler's walltime signal reaches the task through the runner (LSF's SIGUSR2 at the
    run limit comes a grace before the kill); the task ends timeout whether it exits on it or
    is killed after the grace."""
    pool.skip_slurm_over_ssh()
    task_id = pool.submit("alice", "-r", "short", "--", JOB_PYTHON, "-c", TOLD, after)
    task = pool.wait(task_id, "alice")
    assert task["state"] == "timeout", task
    assert "walltime" in task["reason"]
    console = pool.server.cli("logs", str(task_id), token=pool.tokens["alice"]).output
    expected = "told SIGUSR2" if pool.scheduler == "lsf" else "told SIGTERM"
    assert expected in console


TICKS = (
    "import os, time\n"
    "n = 0\n"
    "while not os.path.exists('release'):\n"
    "    time.sleep(0.5)\n"
    "    n += 1\n"
    "    print('tick', n, flush=True)\n"
)


def test_a_running_task_on_pbs_without_job_history_runs_on_past_lost_after(
    test_users: Any,
) -> None:
    """PBS Professional's default keeps no job history, so the server refuses `qstat -x`; the
    pool must not read that as an empty queue and call its running tasks lost."""
    folder = shared_folder("klique-pbs-no-history-")
    calls = folder / "status-calls"
    try:
        job_root = open_folder(folder / "jobs")
        path = search_path(login_node(folder, "pbspro", open_folder(folder / "sim"), calls))
        (folder / "estate.yaml").write_text(estate("pbspro", job_root, None, {"lost_after": "3s"}))
        server = start_server(folder / "home", folder / "estate.yaml", {"PATH": path})
        try:
            token = server.make_token("alice")
            cli = ["submit", "--no-code", "--json", "--", JOB_PYTHON, "-c", TICKS]
            task_id = submitted_id(server.cli(*cli, token=token))
            task = server.wait_state(task_id, {"running"}, timeout=150, token=token)
            job_dir = Path(task["job_dir"])

            def console() -> str:
                path = job_dir / "console.log"
                return path.read_text() if path.exists() else ""

            # The task counts half seconds: once it has run past lost_after and the pool has
            # asked twice more since, a refused `qstat -x` taken for an empty queue would have
            # made it lost.
            wait_for(lambda: "tick 10\n" in console(), 60, "the task to run five seconds")
            asked = len(count_lines(calls))
            wait_for(lambda: len(count_lines(calls)) >= asked + 2, 30, "two more status queries")
            assert server.task(task_id, token)["state"] == "running"
            (job_dir / "release").touch()
            done = server.wait_state(task_id, None, timeout=60, token=token)
            assert done["state"] == "completed", done
            with_history = [line for line in count_lines(calls) if "-x" in line.split()]
            assert len(with_history) == 1  # asked with -x once, then without
        finally:
            stop_server(server)
    finally:
        remove_tree(folder)
