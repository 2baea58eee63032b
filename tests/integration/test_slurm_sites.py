"""The Slurm pool under a site's ordinary settings, on a private cluster started beside the shared
one (tests/conftest_services.py `site_slurm_cluster`: PrivateData=jobs, JobRequeue=1). Each
scenario ends with Slurm's own records: one job per task, and no task lost."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, Server, start_server, stop_server, submitted_id, wait_for
from helpers.batch import (
    JOB_PYTHON,
    count_lines,
    login_node,
    open_folder,
    pool_yaml,
    remove_tree,
    search_path,
    shared_folder,
    start_now,
)
from helpers.slurm import slurm_jobs

pytestmark = pytest.mark.slurm

# Runs until the test creates the file named by its argument: the job stays RUNNING meanwhile.
_UNTIL_FILE = "while not os.path.exists(sys.argv[1]): time.sleep(0.1)"
WAIT_FOR_FILE = "import os,sys,time\n" + _UNTIL_FILE
# The same, having first created the file named by its second argument.
STARTED_THEN_WAIT = "import os,sys,time\nopen(sys.argv[2], 'a').close()\n" + _UNTIL_FILE


@dataclass
class SitePool:
    server: Server
    folder: Path
    estate: Path
    job_root: Path
    calls: Path  # one line per squeue the pool ran: its arguments
    env: dict[str, str]
    tokens: dict[str, str]

    def submit(self, user: str, *command: str, resource: str = "cpu") -> int:
        args = ("submit", "--no-code", "--json", "-r", resource, "--", *command)
        return submitted_id(self.server.cli(*args, token=self.tokens[user]))


@pytest.fixture(scope="module")
def private_jobs_pool(site_slurm_cluster, test_users) -> Iterator[SitePool]:
    """A server whose Slurm pool talks to the PrivateData=jobs cluster; its status commands are
    counted. The query account is alice: as her, squeue shows none of bob's jobs."""
    folder = shared_folder("klique-slurm-sites-")
    job_root = open_folder(site_slurm_cluster.work / f"jobs-{folder.name}")
    calls = folder / "squeue-calls"
    path = search_path(login_node(folder, "slurm", None, calls))
    yield from serve(folder, job_root, path, site_slurm_cluster.conf, calls)


@pytest.fixture
def go(private_jobs_pool: SitePool, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The file a scenario's tasks wait for; made at the end whatever happened, so that a
    failed scenario's tasks end and hold no CPU the next one needs."""
    path = private_jobs_pool.folder / f"go-{request.node.name}"
    yield path
    path.touch()


ESTATE = """
resources:
  cpu:
    profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [batch]}
  held:
    profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [batch]}
    extra_directives: [--hold]
  hidden:
    profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [batch]}
    extra_directives: [--partition=hidden]
  node:
    profile: {cpus: 16, memory: 100M, walltime: 10m, pools: [batch]}
pools:
"""


def serve(folder: Path, job_root: Path, path: str, conf: Path, calls: Path) -> Iterator[SitePool]:
    """A server with one Slurm pool `batch` whose commands come from `path`, on cluster `conf`."""
    estate = folder / "estate.yaml"
    estate.write_text(ESTATE + pool_yaml("slurm", job_root, None))
    env = {"PATH": path, "SLURM_CONF": str(conf)}
    server = start_server(folder / "home", estate, env)
    try:
        tokens = {u: server.make_token(u) for u in ("alice", "bob")}
        yield SitePool(server, folder, estate, job_root, calls, env, tokens)
    finally:
        stop_server(server)
        remove_tree(job_root)
        remove_tree(folder)


def slurm_jobs_of(site: SitePool) -> dict[str, list[tuple[str, str]]]:
    """Slurm's own record of the jobs whose script lies under the site's job root, by job name
    (as root, who sees every job): name -> [(job id, state)]."""
    found = slurm_jobs(site.job_root, conf=site_conf(site))
    return {name: [(job.native_id, job.state) for job in jobs] for name, jobs in found.items()}


def test_every_users_job_is_seen_where_private_data_hides_them(private_jobs_pool, go):
    site = private_jobs_pool
    tasks = {
        site.submit(user, JOB_PYTHON, "-c", WAIT_FOR_FILE, str(go)): user
        for user in ("alice", "bob", "alice", "bob")
    }
    held = site.submit("bob", "true", resource="held")
    # Bob's held job is seen pending with Slurm's own reason, though alice's squeue hides it
    # (seen by nothing else: its runner has not started to report).
    task = site.server.wait_state(held, {"pending"}, timeout=90, token=site.tokens["bob"])
    assert task["reason"] == "pending in Slurm's queue; JobHeldUser", task
    release = ["scontrol", "release", str(task["native_id"])]
    subprocess.run(release, check=True, env={"PATH": "/usr/bin:/bin", **site.env})
    tasks[held] = "bob"
    for task_id, user in tasks.items():
        site.server.wait_state(
            task_id, {"running", "completed"}, timeout=90, token=site.tokens[user]
        )
    go.touch()
    ended = {
        task_id: site.server.wait_state(task_id, timeout=90, token=site.tokens[user])
        for task_id, user in tasks.items()
    }
    assert {t["state"] for t in ended.values()} == {"completed"}, ended

    # Status: one squeue per account per cycle, each naming one account, never a job.
    calls = count_lines(site.calls)
    assert calls and all(c.count("--users=") == 1 and "--jobs" not in c for c in calls)
    assert {c.split("--users=")[1].split()[0] for c in calls} == {"alice", "bob"}
    assert all("--all" in c.split() for c in calls)

    # Slurm's own records: exactly one job per task, none lost.
    records = slurm_jobs_of(site)
    tags = {f"klique-{task_id}" for task_id in tasks}
    assert {name: len(jobs) for name, jobs in records.items()} == dict.fromkeys(tags, 1)
    assert all(state == "COMPLETED" for jobs in records.values() for _, state in jobs)


def site_conf(site: SitePool) -> Path:
    return Path(site.env["SLURM_CONF"])


def test_slurms_own_requeue_moves_a_running_task_back_to_pending(private_jobs_pool, go):
    """JobRequeue=1 and `scontrol requeue` (scontrol(1)): the running job goes back to Slurm's
    queue and runs again in its folder; its restart count grows, so Klique shows the task
    pending with Slurm's reason, then running, then completed: one job, one task."""
    site = private_jobs_pool
    task_id = site.submit("alice", JOB_PYTHON, "-c", WAIT_FOR_FILE, str(go))
    alice = site.tokens["alice"]
    task = site.server.wait_state(task_id, {"running"}, timeout=90, token=alice)
    env = {"PATH": "/usr/bin:/bin", **site.env}
    subprocess.run(["scontrol", "requeue", str(task["native_id"])], check=True, env=env)

    def moves() -> list[tuple[str, str]]:
        return [(e["from"], e["to"]) for e in site.server.task(task_id, alice)["events"]]

    def running_again() -> bool:
        back = [i for i, move in enumerate(moves()) if move == ("running", "pending")]
        return bool(back) and moves()[-1][1] == "running" and len(moves()) > back[-1] + 1

    wait_for(lambda: ("running", "pending") in moves(), 120, "the task back to pending")
    # Slurm holds a requeued job back (BeginTime, two minutes here) and starts it at its next
    # scheduling pass; once Klique has shown the move, an operator's start-now ends that wait.
    start_now(env, str(task["native_id"]))
    wait_for(running_again, 240, "the run after the requeue")
    go.touch()
    ended = site.server.wait_state(task_id, timeout=90, token=alice)
    assert ended["state"] == "completed", ended
    events = ended["events"]
    back = [e for e in events if e["from"] == "running" and e["to"] == "pending"]
    assert len(back) == 1 and back[0]["reason"].startswith("requeued by slurm (restart 1): ")
    assert [e["to"] for e in events][-3:] == ["pending", "running", "completed"]
    records = slurm_jobs_of(site)
    assert records[f"klique-{task_id}"] == [(str(task["native_id"]), "COMPLETED")]


def test_a_task_preempted_by_requeue_waits_and_runs_again(private_jobs_pool, go):
    """PreemptMode=REQUEUE: bob's job in the `urgent` partition needs the node that alice's
    task holds whole; Slurm requeues her job (same id, restart count 1) and runs bob's. Klique
    shows her task pending with Slurm's reason, then running again, then completed: one job."""
    site = private_jobs_pool
    started = open_folder(site.folder / "marks") / "started"
    alice = site.tokens["alice"]
    env = {"PATH": "/usr/bin:/bin", **site.env}
    command = ("-c", STARTED_THEN_WAIT, str(go), str(started))
    task_id = site.submit("alice", JOB_PYTHON, *command, resource="node")
    task = site.server.wait_state(task_id, {"running"}, timeout=90, token=alice)
    # Preempted once the command runs (a job preempted while its runner sets up is another
    # race, not this scenario).
    wait_for(started.exists, 90, "the task's command to start")
    urgent = subprocess.run(
        [
            "runuser",
            "-u",
            "bob",
            "--",
            "sbatch",
            "--parsable",
            "--partition=urgent",
            "--cpus-per-task=16",
            "--mem=100M",
            "--output=/dev/null",
            "--wrap=true",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=site.job_root,
    ).stdout.strip()

    def moves() -> list[tuple[str, str]]:
        return [(e["from"], e["to"]) for e in site.server.task(task_id, alice)["events"]]

    wait_for(lambda: ("running", "pending") in moves(), 120, "the task back to pending")
    wait_for(lambda: not squeue_as("bob", site, f"--jobs={urgent}"), 120, "bob's job to end")
    start_now(env, str(task["native_id"]))  # past Slurm's hold of a requeued job
    wait_for(lambda: moves()[-1] == ("pending", "running"), 240, "the run after preemption")
    go.touch()
    ended = site.server.wait_state(task_id, timeout=90, token=alice)
    assert ended["state"] == "completed", ended
    back = [e for e in ended["events"] if (e["from"], e["to"]) == ("running", "pending")]
    assert len(back) == 1 and back[0]["reason"].startswith("requeued by slurm (restart 1): ")
    records = slurm_jobs_of(site)
    assert records[f"klique-{task_id}"] == [(str(task["native_id"]), "COMPLETED")]


def squeue_as(user: str, site: SitePool, *args: str) -> list[str]:
    """The job ids `user`'s own squeue lists with `args`."""
    done = subprocess.run(
        ["runuser", "-u", user, "--", "squeue", "--noheader", "--format=%i", *args],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", **site.env},
    )
    return done.stdout.split()


def test_a_task_in_a_hidden_partition_is_seen_to_its_end(private_jobs_pool, go):
    """squeue(1) --all: without it, jobs in partitions configured Hidden=YES are not listed
    (and squeue still exits 0); Klique's status asks with --all."""
    site = private_jobs_pool
    alice = site.tokens["alice"]
    task_id = site.submit("alice", JOB_PYTHON, "-c", WAIT_FOR_FILE, str(go), resource="hidden")
    task = site.server.wait_state(task_id, {"running"}, timeout=90, token=alice)
    job = str(task["native_id"])
    assert job not in squeue_as("alice", site) and job in squeue_as("alice", site, "--all")
    go.touch()
    ended = site.server.wait_state(task_id, timeout=90, token=alice)
    assert ended["state"] == "completed", ended
    records = slurm_jobs_of(site)
    assert records[f"klique-{task_id}"] == [(job, "COMPLETED")]


def test_a_job_held_after_its_launch_failed_is_released_and_runs(private_jobs_pool):
    """The node's Prolog fails (slurm.conf(5) Prolog): slurmd drains the node, slurmctld requeues
    the job and holds it, squeue's reason "launch failed requeued held". The pool's
    `requeued_held: release` (the default) has Klique release it as the task's account, and
    says so; once an operator resumes the node the job runs: the task completes, one job."""
    site = private_jobs_pool
    alice = site.tokens["alice"]
    env = {"PATH": "/usr/bin:/bin", **site.env}
    fail_once = site_conf(site).parent / "fail-next-prolog"
    fail_once.touch()
    try:
        task_id = site.submit("alice", "true")

        def released() -> dict | None:
            task = site.server.task(task_id, alice)
            return task if "released by Klique" in task["reason"] else None

        task = wait_for(released, 120, "Klique to release the held job")
    finally:
        fail_once.unlink(missing_ok=True)
        resume = ["scontrol", "update", "nodename=localhost", "state=resume"]
        subprocess.run(resume, env=env, capture_output=True, check=False)
    assert task["state"] == "pending", task
    assert "launch failed requeued held" in task["reason"], task
    assert task["reason"].endswith("released by Klique (requeued_held: release)"), task
    start_now(env, str(task["native_id"]))  # past Slurm's hold of a requeued job
    ended = site.server.wait_state(task_id, timeout=120, token=alice)
    assert ended["state"] == "completed", ended
    records = slurm_jobs_of(site)
    assert records[f"klique-{task_id}"] == [(str(task["native_id"]), "COMPLETED")]


def test_estate_check_says_which_status_mode_the_pool_uses(private_jobs_pool):
    site = private_jobs_pool
    done = subprocess.run(
        [sys.executable, "-m", "broker", "estate", "check", str(site.estate)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env={**os.environ, **site.env, "KLIQUE_HOME": str(site.folder / "home")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "note: pool batch: PrivateData=jobs hides other users' jobs: one squeue (and sacct) per "
        "mapped account per cycle"
    ) in done.stdout, done.stdout


# sbatch behind a link that loses slurmctld's replies, in turn: the job is queued and the reply
# lost ("Socket timed out"), the request is lost (nothing queued, "Zero Bytes were transmitted"),
# then an ordinary submission. sbatch's words are those of src/common/slurm_errno.c.
LOSSY_SBATCH = """#!/bin/sh
count='{count}'
n=$(flock "$count" sh -c 'n=$(( $(cat "$1") + 1 )); echo $n >"$1"; echo $n' _ "$count")
case $((n % 3)) in
  1) {sbatch} "$@" >/dev/null 2>&1
     echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation" >&2
     exit 1 ;;
  2) echo "sbatch: error: Batch job submission failed: Zero Bytes were transmitted or received" >&2
     exit 1 ;;
  *) exec {sbatch} "$@" ;;
esac
"""


@pytest.fixture
def lossy_pool(slurm_cluster, test_users) -> Iterator[SitePool]:
    """A server on the shared cluster whose sbatch loses replies (see LOSSY_SBATCH)."""
    folder = shared_folder("klique-slurm-lossy-")
    job_root = open_folder(slurm_cluster.work / f"jobs-{folder.name}")
    bin_dir = login_node(folder, "slurm", None)
    count = folder / "sbatch-count"
    count.write_text("0\n")
    count.chmod(0o666)
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(LOSSY_SBATCH.format(count=count, sbatch="/usr/bin/sbatch"))
    yield from serve(folder, job_root, search_path(bin_dir), slurm_cluster.conf, count)


def test_a_lost_sbatch_reply_never_makes_a_second_job(lossy_pool):
    site = lossy_pool
    tasks = [site.submit("alice", "true") for _ in range(6)]
    ended = {t: site.server.wait_state(t, timeout=120, token=site.tokens["alice"]) for t in tasks}
    assert {t["state"] for t in ended.values()} == {"completed"}, ended
    submissions = int(site.calls.read_text())
    assert submissions > len(tasks)  # some replies were lost, some requests too

    records = slurm_jobs_of(site)
    tags = {f"klique-{task_id}" for task_id in tasks}
    assert {name: len(jobs) for name, jobs in records.items()} == dict.fromkeys(tags, 1)
    assert all(state == "COMPLETED" for jobs in records.values() for _, state in jobs)
