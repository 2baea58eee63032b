"""Chaos scenarios on the real Slurm cluster of scripts/slurm-up: faults at chosen points, then
every task accounted for against Slurm's own job list. Shared by tests/chaos and bench/chaos.py.

A scenario returns an Outcome (faults, tasks, duplicates, lost, wrong_final, and the problems
behind any non-zero count); it raises only when the harness itself cannot go on.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from conftest import HTTP_TLS, ROOT, Server, free_port, stop_server, wait_for
from helpers.slurm import SlurmJob, newest_job_id, slurm_jobs

from broker.domain import Task, TaskSpec, TaskState
from broker.pools.arrays import ARRAY_NAME, elements_of
from broker.store.repository import Store

SCRIPTS = ROOT / "scripts"
SLURM_DIR = Path(os.environ.get("KLIQUE_SLURM_DIR", "/tmp/klique-slurm"))
SSH_DIR = Path(os.environ.get("KLIQUE_SSH_DIR", "/tmp/klique-ssh"))
SSH_PORT = int(os.environ.get("KLIQUE_SSH_PORT", "2222"))
USERS = ("alice", "bob")
JOB_PYTHON = "/usr/bin/python3"  # the test accounts cannot read the virtual environment's

# Where the server is killed, in order, in the crash scenario: each point ends one life of
# the server with SIGKILL the n-th time that life reaches it (broker/faults.py).
CRASH_POINTS = (
    "after_submit:1",
    "before_submit:3",
    "after_submit:40",
    "after_poll:2",
    "after_submit:12",
    "before_submit:9",
    "after_poll:1",
    "after_submit:25",
    "after_submit:5",
    "after_poll:3",
    "before_submit:1",
    "after_submit:2",
)


@dataclass(frozen=True)
class Expected:
    state: str
    exit_code: int | None


COMPLETED = Expected("completed", 0)
FAILED_3 = Expected("failed", 3)
LOST = Expected("lost", None)
# Jobs that Slurm itself ended, as their tasks must end (sacct(1), JOB STATE CODES): the state
# Klique reads from Slurm's own record, whatever the command would have done.
SLURM_ENDED = {
    "TIMEOUT": Expected("timeout", None),
    "NODE_FAIL": Expected("lost", None),
    "BOOT_FAIL": Expected("lost", None),
}


@dataclass(frozen=True)
class Work:
    owner: str
    command: tuple[str, ...]
    expect: Expected


def mixed_work(count: int, sleep_s: int = 2) -> list[Work]:
    """Cheap tasks for both users: most exit 0, every tenth exits 3, every fifth sleeps first."""
    work = []
    for i in range(count):
        owner = USERS[i % 2]
        if i % 10 == 3:
            work.append(Work(owner, ("sh", "-c", "exit 3"), FAILED_3))
        elif i % 5 == 1:
            work.append(Work(owner, ("sleep", str(sleep_s)), COMPLETED))
        else:
            work.append(Work(owner, ("true",), COMPLETED))
    return work


@dataclass
class Outcome:
    scenario: str
    faults: int
    tasks: int
    duplicates: int = 0
    lost: int = 0
    wrong_final: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.duplicates or self.lost or self.wrong_final or self.problems)

    def line(self) -> str:
        text = (
            f"{self.scenario}: faults={self.faults} tasks={self.tasks} "
            f"duplicates={self.duplicates} lost={self.lost} wrong_final={self.wrong_final} "
            f"({self.seconds:.0f} s)"
        )
        extra = "; ".join([*self.notes, *self.problems[:5]])
        return f"{text}: {extra}" if extra else text

    def explain(self) -> str:
        return "\n".join([self.line(), *self.problems])


# Slurm's own view.


def _run(argv: Sequence[str], timeout: float = 60) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def sbatch(account: str, *options: str) -> int:
    """Submit a job as `account` with sbatch's own options; its id."""
    out = _run(["runuser", "-u", account, "--", "sbatch", "--parsable", *options])
    return int(out.strip().split(";")[0])


def job_pids(job_id: str) -> list[int]:
    """The processes of a running job (scontrol listpids), the batch step's first."""
    pids = []
    for line in _run(["scontrol", "listpids", job_id]).splitlines()[1:]:
        parts = line.split()
        if parts and parts[0].isdigit():
            pids.append(int(parts[0]))
    return pids


def slurm_script(name: str, *args: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        [str(SCRIPTS / name), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0:
        raise RuntimeError(f"scripts/{name} {' '.join(args)}: {done.stdout}{done.stderr}")


def cluster_min_job_age() -> int | None:
    """The running controller's MinJobAge (scripts/slurm-up sets it; another session's
    slurm-up sets it back to its own)."""
    for line in _run(["scontrol", "show", "config"]).splitlines():
        if line.startswith("MinJobAge"):
            return int(line.split("=", 1)[1].split()[0])
    return None


def controller_up() -> bool:
    done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, check=False)
    return "is UP" in done.stdout


# One Klique installation under test: a home, an estate and a job root of its own.


def estate_text(
    job_root: Path,
    transport: str,
    lost_after: str,
    max_queued: int,
    walltime: str = "10m",
    agent: str = "server",
) -> str:
    if transport == "ssh":
        how = (
            f"{{kind: ssh, host: 127.0.0.1, port: {SSH_PORT}, "
            f"known_hosts: {SSH_DIR}/known_hosts, client_keys: [{SSH_DIR}/client_key]}}"
        )
    else:
        how = "{kind: local}"
    return f"""
resources:
  cpu:
    profile: {{cpus: 1, memory: 100M, walltime: {walltime}, pools: [slurm]}}
pools:
  slurm:
    kind: slurm
    agent: {agent}
    partition: debug
    job_root: {job_root}
    transport: {how}
    python: {JOB_PYTHON}
    poll_interval: 1s
    lost_after: {lost_after}
    max_queued: {max_queued}
    accounting: jobcomp
    user_map: {{alice: alice, bob: bob}}
"""


_last_base = 0


def server_store_url(home: Path) -> str:
    """The store a server started with KLIQUE_HOME=home (and no KLIQUE_DB) uses."""
    return f"sqlite:///{home / 'klique.db'}"


def seed_task_ids(home: Path) -> int:
    """Make this home's task ids start past a base no other run on the shared cluster uses, so
    every tag (klique-<id>) names only this run's jobs; returns the first task id."""
    global _last_base
    base = max(int(time.time()) % 2_000_000 * 1000, _last_base + 1000)
    _last_base = base
    store = Store.open(server_store_url(home))
    try:
        seed = store.create_task(
            TaskSpec(("true",), "cpu", name="chaos: where task ids start"),
            "chaos",
            None,
            state=TaskState.CANCELLED,
            reason="placeholder: the next task id follows this one",
        )
    finally:
        store.close()
    with sqlite3.connect(home / "klique.db") as db:  # foreign keys are off on this connection
        db.execute("UPDATE task_events SET task_id = ? WHERE task_id = ?", (base, seed.id))
        db.execute("UPDATE tasks SET id = ? WHERE id = ?", (base, seed.id))
    return base + 1


@dataclass(frozen=True)
class Life:
    """What one crash left: problems, and the tasks PLACED at it with a job and in all."""

    problems: list[str]
    found: int
    unknown: int


class ChaosRun:
    """A Klique server on the real Slurm pool that the scenario kills and restarts at will."""

    def __init__(
        self,
        name: str,
        workdir: Path,
        *,
        transport: str = "local",
        lost_after: str = "60s",
        max_queued: int = 100,
        walltime: str = "10m",
        agent: str = "server",
    ) -> None:
        self.name = name
        self.home = workdir / name / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.job_root = SLURM_DIR / "work" / f"chaos-{name}-{os.getpid()}-{time.time_ns()}"
        self.job_root.mkdir(mode=0o1777)
        os.chmod(self.job_root, 0o1777)  # the jobs' accounts write their files here
        self.estate = workdir / name / "estate.yaml"
        self.estate.write_text(
            estate_text(self.job_root, transport, lost_after, max_queued, walltime, agent)
        )
        self.first_id = seed_task_ids(self.home)
        self.store = Store(server_store_url(self.home))
        self.since = time.time()
        self.since_job = newest_job_id()
        self.expected: dict[int, Expected] = {}
        self.server: Server | None = None
        self.tokens: dict[str, str] = {}
        self.strangers: set[int] = set()  # task ids whose tags the run gives to jobs of its own
        self.foreign: set[int] = set()  # Slurm jobs of "another installation", left out of counts
        self.lives = 0
        self.port = free_port()  # kept across restarts: a remote agent knows this address
        self.routes_port = free_port()  # named, not the default next port, which may be taken
        self.env: dict[str, str] = {}  # more of the server's environment (a PATH of its own)

    # The server.

    def launch(self, crash_at: str | None = None) -> Server:
        """Start the server on this home; with `crash_at` it kills itself at that point. A
        server that dies before it answers is returned too (its process has a returncode)."""
        port = self.port
        args = [sys.executable, "-m", "broker", "server", "--port", str(port)]
        args += ["--routes-port", str(self.routes_port)]
        args += ["--public-url", f"http://127.0.0.1:{port}"]  # the simulated nodes are here
        env = {**os.environ, **self.env, "KLIQUE_HOME": str(self.home)}
        env.pop("KLIQUE_CRASH_AT", None)
        if crash_at:
            env["KLIQUE_CRASH_AT"] = crash_at
        self.lives += 1
        with (self.home / "server.log").open("ab") as log:
            log.write(f"\n--- life {self.lives}: crash at {crash_at or 'never'}\n".encode())
            log.flush()
            process = subprocess.Popen(
                [*args, "--estate", str(self.estate)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        url = f"http://127.0.0.1:{port}"

        def up_or_gone() -> bool:
            if process.poll() is not None:
                return True
            try:
                health = httpx.get(url + "/api/v1/health", timeout=1, verify=HTTP_TLS)
                return health.status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up_or_gone, 60, f"the server of {self.name} to answer")
        token_file = self.home / "admin.token"
        token = token_file.read_text().strip() if token_file.exists() else ""
        self.server = Server(url, self.home, token, process)
        return self.server

    def await_crash(self, point: str, timeout: float = 120) -> None:
        """The server must die by its own SIGKILL at `point`."""
        assert self.server is not None
        try:
            code = self.server.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(
                f"{self.name}: the server never reached crash point {point} in {timeout:g} s"
            ) from None
        if code != -signal.SIGKILL:
            raise RuntimeError(f"{self.name}: the server exited {code}, not by SIGKILL at {point}")

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is None or server.process.poll() is not None:
            return
        stop_server(server)

    def close(self) -> None:
        self.stop()
        self.store.close()
        shutil.rmtree(self.job_root, ignore_errors=True)  # the home keeps the log and the store

    def api(self) -> httpx.Client:
        assert self.server is not None
        return self.server.api()

    # Tasks.

    def queue(self, work: Sequence[Work]) -> list[int]:
        """Tasks waiting in Klique's queue before the server starts (the API's own write)."""
        ids = []
        for item in work:
            spec = TaskSpec(item.command, "cpu", name=f"chaos {self.name}")
            task = self.store.create_task(spec, item.owner, None)
            self.expected[task.id] = item.expect
            ids.append(task.id)
        return ids

    def life_until(self, point: str) -> Life:
        """One life of the server, SIGKILLed at `point`; then Slurm's jobs against the store:
        no task with two jobs, and after a submission, some task left PLACED with its job."""
        self.launch(point)
        self.await_crash(point)
        problems = [f"after {point}: {p}" for p in self.duplicates()]
        jobs = self.jobs()
        placed = self.in_state(TaskState.PLACED)
        found = sum(1 for t in placed if t.tag in jobs)
        if point.startswith("after_submit") and not found:
            problems.append(f"{point}: no PLACED task had a job: the window was missed")
        return Life(problems, found, len(placed))

    def queue_sweep(self, work: Sequence[Work]) -> list[int]:
        """The same as one sweep per owner (as `klique submit --sweep` makes it)."""
        ids = []
        for owner in USERS:
            mine = [item for item in work if item.owner == owner]
            items = [(TaskSpec(w.command, "cpu", name=f"chaos {self.name}"), 0.0, {}) for w in mine]
            _sweep, tasks = self.store.create_queued(items, owner, None, sweep=self.name)
            for item, task in zip(mine, tasks, strict=True):
                self.expected[task.id] = item.expect
                ids.append(task.id)
        return ids

    def submit(self, work: Sequence[Work]) -> list[int]:
        """Tasks submitted through the API as their owners."""
        assert self.server is not None
        for user in USERS:
            if user not in self.tokens:
                self.tokens[user] = self.server.make_token(user)
        ids = []
        for item in work:
            with self.server.api(self.tokens[item.owner]) as api:
                answer = api.post(
                    "/tasks", json={"command": list(item.command), "name": f"chaos {self.name}"}
                )
            answer.raise_for_status()
            task_id = int(answer.json()["id"])
            self.expected[task_id] = item.expect
            ids.append(task_id)
        return ids

    def tasks(self) -> dict[int, Task]:
        return {t.id: t for t in self.store.tasks() if t.id in self.expected}

    def in_state(self, *states: TaskState) -> list[Task]:
        return [t for t in self.tasks().values() if t.state in states]

    def all_final(self) -> bool:
        return all(t.state.final for t in self.tasks().values())

    def wait_final(self, timeout: float) -> bool:
        try:
            wait_for(self.all_final, timeout, "every task to end", interval=0.5)
        except AssertionError:
            return False
        return True

    def jobs(self) -> dict[str, list[SlurmJob]]:
        """This run's jobs by the tag of the task each runs: a job's name, or for an array
        element, the tag of the task whose folder its array's dispatcher names at its index."""
        found: dict[str, list[SlurmJob]] = {}
        for name, jobs in slurm_jobs(since_job=self.since_job, recorded_since=self.since).items():
            for job in jobs:
                if job.job_id not in self.foreign:
                    found.setdefault(self._tag_of(name, job), []).append(job)
        return found

    def _tag_of(self, name: str, job: SlurmJob) -> str:
        if job.index is None or not ARRAY_NAME.fullmatch(name):
            return name
        first, token = name.removeprefix("klique-array-").split("-")
        script = self.job_root / f"klique-{first}-0-{token}" / "job.sh"
        if not script.exists():
            return name
        folders = {n: f for f, n in elements_of(script.read_text()).items()}
        folder = folders.get(job.index)
        return "-".join(Path(folder).name.split("-")[:2]) if folder else name

    def duplicates(self) -> list[str]:
        """Against Slurm's job list now: no task has two jobs, and every task the store says
        reached Slurm has its one job there, under the id the store recorded."""
        tasks = self.tasks()  # first: a task recorded as submitted has its job by then
        jobs = self.jobs()
        problems = []
        for task in tasks.values():
            found = jobs.get(task.tag, [])
            ids = [j.native_id for j in found]
            reached = task.state not in (TaskState.QUEUED, TaskState.PLACED)
            if len(found) > 1 or (reached and not found):
                problems.append(f"task {task.id} ({task.state.value}) has Slurm jobs {ids}")
            elif reached and task.native_id and task.native_id not in ids:
                problems.append(f"task {task.id} records job {task.native_id}; Slurm has {ids}")
        return problems

    def account(
        self, scenario: str, faults: int, started: float, as_slurm_recorded: bool = False
    ) -> Outcome:
        """Every task against Slurm: one job each, the right final state, none lost. With
        `as_slurm_recorded`, a job that Slurm itself ended (its walltime, a node failure) must
        end its task the way Slurm recorded it, whatever its command would have done."""
        outcome = Outcome(scenario, faults, len(self.expected))
        jobs = self.jobs()
        tasks = self.tasks()
        for task_id, want in sorted(self.expected.items()):
            task = tasks[task_id]
            found = jobs.get(task.tag, [])
            if as_slurm_recorded and len(found) == 1 and found[0].state in SLURM_ENDED:
                want = SLURM_ENDED[found[0].state]
            if len(found) > 1:
                outcome.duplicates += len(found) - 1
                outcome.problems.append(
                    f"task {task_id} has {len(found)} Slurm jobs: {[j.native_id for j in found]}"
                )
            seen = (task.state.value, task.exit_code)
            lost = task.state is TaskState.LOST and want.state != "lost"
            if not task.state.final or not found or lost:
                outcome.lost += 1
                outcome.problems.append(
                    f"task {task_id} is {task.state.value} ({task.reason!r}) with Slurm jobs "
                    f"{[(j.native_id, j.state) for j in found]}; expected {want.state}"
                )
            elif task.state.value != want.state or (
                want.exit_code is not None and task.exit_code != want.exit_code
            ):
                outcome.wrong_final += 1
                outcome.problems.append(
                    f"task {task_id} ended {seen} ({task.reason!r}); expected "
                    f"{(want.state, want.exit_code)}"
                )
            elif task.native_id and task.native_id not in {j.native_id for j in found}:
                outcome.wrong_final += 1
                outcome.problems.append(
                    f"task {task_id} records job {task.native_id} but Slurm's job for its tag "
                    f"is {[j.native_id for j in found]}"
                )
        ours = set(self.expected) | self.strangers
        for name, found in jobs.items():
            number = _task_id(name)
            in_range = number is not None and self.first_id <= number < self.first_id + 999
            if in_range and number not in ours:
                outcome.duplicates += len(found)
                outcome.problems.append(f"jobs {found} carry a tag no task of the run owns")
        log = (self.home / "server.log").read_text(errors="replace")
        for words in ("placement cycle failed", "Traceback (most recent call last)"):
            if words in log:  # a last resort was needed: a bug, whatever the cause
                at = log.index(words)
                outcome.problems.append(
                    f"{log.count(words)} times {words!r} in the log; the first:\n"
                    + log[at : at + 2000]
                )
        outcome.seconds = time.monotonic() - started
        return outcome


def _task_id(name: str) -> int | None:
    prefix, _, number = name.partition("-")
    return int(number) if prefix == "klique" and number.isdigit() else None


@contextmanager
def chaos_run(name: str, workdir: Path, **options: Any) -> Iterator[ChaosRun]:
    run = ChaosRun(name, workdir, **options)
    try:
        yield run
    finally:
        run.close()


# The scenarios.


def crash_and_restart(
    workdir: Path, tasks: int = 300, points: Sequence[str] = CRASH_POINTS
) -> Outcome:
    """Tasks to Slurm while the server is SIGKILLed at each of `points` in turn and restarted on
    the same home; after every crash no task has two jobs, and at the end every task has one."""
    started = time.monotonic()
    with chaos_run("crash", workdir, lost_after="120s", max_queued=24) as run:
        run.queue(mixed_work(tasks))
        run.strangers.add(run.first_id + 998)
        stranger = sbatch(
            "alice",
            f"--job-name=klique-{run.first_id + 998}",
            f"--output={run.job_root}/stranger-%j.out",
            "--wrap=sleep infinity",  # running at the check however long the crashes take
        )
        problems: list[str] = []
        found = resubmitted = 0  # tasks PLACED at a crash with a job in Slurm, and without
        lives: list[str] = []
        try:
            for point in points:
                life = run.life_until(point)
                problems += life.problems
                found += life.found
                resubmitted += life.unknown - life.found
                lives.append(f"{point}: {_submitted(run)} submitted, {life.unknown} unknown")
            run.launch()
            if not run.wait_final(300):
                problems.append("not every task ended within 300 s of the last restart")
            with run.api() as api:
                pools = {p["name"]: p for p in api.get("/pools").json()}
            if str(stranger) not in pools["slurm"].get("unknown_jobs", []):
                problems.append(f"the stranger job {stranger} is not reported: {pools['slurm']}")
            states = {j.job_id: j.state for js in run.jobs().values() for j in js}
            if states.get(stranger) != "RUNNING":
                problems.append(f"the stranger job {stranger} is {states.get(stranger)}")
        finally:
            subprocess.run(["scancel", str(stranger)], check=False)
            run.stop()
        outcome = run.account("crash-restart", len(points), started)
    outcome.problems += problems
    outcome.notes.append(
        f"PLACED at a crash: {found} with a job in Slurm (to be found by tag), "
        f"{resubmitted} without one (to be submitted again)"
    )
    outcome.notes += lives
    return outcome


# Array crash points: after an array's sbatch, none of its elements recorded (a batch's jobs
# are recorded in one transaction); before a batch is sent, all its tasks begun; after the
# sbatch of a wave's second array (the 30th element of the life; a wave is two owners' arrays
# of about 20 each), the first array's record done or under way.
ARRAY_POINTS = ("after_submit:1", "before_submit:1", "after_submit:30")


def array_crash(workdir: Path, tasks: int = 160, points: Sequence[str] = ARRAY_POINTS) -> Outcome:
    """Sweeps go to Slurm as job arrays (waves of up to 40 tasks, one array per owner) while
    the server is SIGKILLed at each of `points` and restarted: after every crash no task has
    two elements, and at the end every task has exactly one, all of them in arrays."""
    started = time.monotonic()
    with chaos_run("array-crash", workdir, lost_after="120s", max_queued=40) as run:
        run.queue_sweep(mixed_work(tasks))
        problems: list[str] = []
        adopted = resubmitted = 0
        try:
            for point in points:
                life = run.life_until(point)
                problems += life.problems
                adopted += life.found
                resubmitted += life.unknown - life.found
            run.launch()
            if not run.wait_final(300):
                problems.append("not every task ended within 300 s of the last restart")
        finally:
            run.stop()
        outcome = run.account("array-crash", len(points), started)
        ids = [str(t.native_id) for t in run.tasks().values()]
    arrays = {i.partition("_")[0] for i in ids if "_" in i}
    if len(arrays) < len(points):  # a wave of one owner's tasks may leave one task alone
        problems.append(f"only {len(arrays)} job arrays for {len(ids)} tasks")
    outcome.problems += problems
    outcome.notes.append(
        f"{len(arrays)} arrays ran {sum('_' in i for i in ids)} of {len(ids)} tasks; PLACED at a "
        f"crash: {adopted} with an element in Slurm (found by their array's dispatcher), "
        f"{resubmitted} without one (submitted again)"
    )
    return outcome


def controller_outage(workdir: Path, tasks: int = 40, outage_s: float = 45) -> Outcome:
    """slurmctld stopped for `outage_s` with jobs running, pending and still in Klique's queue:
    no task fails for it, the pool shows unreachable with the reason, all finish after."""
    started = time.monotonic()
    problems: list[str] = []
    notes: list[str] = []
    # Slurm can keep a job it allocated at the moment it stopped "running" with no process
    # until its walltime: short walltimes let Slurm's own recovery fit the wait.
    with chaos_run("outage", workdir, walltime="90s") as run:
        run.launch()
        run.submit(mixed_work(tasks, sleep_s=6))
        wait_for(
            lambda: len(run.in_state(TaskState.RUNNING)) >= 4,
            120,
            "tasks to run before the outage",
            interval=0.2,
        )
        try:
            slurm_script("slurm-ctl", "stop", "slurmctld")
            outage_began = time.monotonic()
            run.submit(mixed_work(8))  # these wait in Klique's queue for the controller
            try:
                wait_for(lambda: _pool(run)["reachable"] is False, outage_s, "pool unreachable")
                pool = _pool(run)
                seen_after = time.monotonic() - outage_began
                if not pool["reason"]:
                    problems.append(f"the pool is unreachable without a reason: {pool}")
                notes.append(f"unreachable after {seen_after:.0f} s: {pool['reason']!r}")
            except AssertionError as exc:
                problems.append(f"during the outage: {exc}")
            problems += _wrong_endings(run, "during the outage")
            time.sleep(max(0.0, outage_s - (time.monotonic() - outage_began)))  # the fault
            problems += _wrong_endings(run, "at the end of the outage")
        finally:
            slurm_script("slurm-ctl", "start", "slurmctld")
        if not run.wait_final(300):
            problems.append("not every task ended within 300 s of the controller's return")
        try:
            wait_for(lambda: _pool(run)["reachable"], 60, "the pool to be reachable again")
        except AssertionError as exc:
            problems.append(str(exc))
        run.stop()
        outcome = run.account("controller-outage", 1, started, as_slurm_recorded=True)
    outcome.problems += problems
    outcome.notes += notes
    return outcome


def _pool(run: ChaosRun) -> dict[str, Any]:
    with run.api() as api:
        pools: dict[str, dict[str, Any]] = {p["name"]: p for p in api.get("/pools").json()}
    return pools["slurm"]


def _wrong_endings(run: ChaosRun, when: str) -> list[str]:
    """Tasks that already ended in a state other than the one they must end in."""
    return [
        f"{when}: task {t.id} ended {t.state.value} ({t.reason!r})"
        for t in run.tasks().values()
        if t.state.final and t.state.value != run.expected[t.id].state
    ]


def ssh_drops(workdir: Path, tasks: int = 150, every: int = 3) -> Outcome:
    """Tasks submitted over SSH while the server's SSH connections are killed (their sshd
    processes, by pid) each time `every` more tasks have reached Slurm, and at least one since
    the last kill (so each kill meets a connection that was working)."""
    started = time.monotonic()
    problems: list[str] = []
    kills = 0
    with chaos_run("ssh", workdir, transport="ssh", max_queued=12) as run:
        run.queue(mixed_work(tasks))
        server = run.launch()
        last = 0
        for goal in range(every, tasks, every):

            def due(goal: int = goal, last: int = last) -> bool:
                if run.all_final():  # nothing is left to submit
                    return True
                done = _submitted(run)
                live = done >= goal and done > last and ssh_connection_pids(server.process.pid)
                return bool(live)

            try:
                wait_for(due, 120, f"{goal} tasks to reach Slurm over a live SSH connection", 0.02)
            except AssertionError as exc:
                problems.append(str(exc))
                break
            if run.all_final():
                break
            if kill_ssh_connections(server.process.pid):
                kills += 1
            last = _submitted(run)
            problems += [f"after {kills} connection kills: {p}" for p in run.duplicates()]
        if not run.wait_final(240):
            problems.append("not every task ended within 240 s")
        run.stop()
        unknown = (run.home / "server.log").read_text().count("submission outcome unknown")
        outcome = run.account("ssh-drops", kills, started)
    outcome.problems += problems
    outcome.notes.append(f"{unknown} submissions with an unknown outcome")
    return outcome


def _submitted(run: ChaosRun) -> int:
    waiting = (TaskState.QUEUED, TaskState.PLACED)
    return sum(1 for t in run.tasks().values() if t.state not in waiting)


def _tcp_sockets() -> list[tuple[int, int, int]]:
    """(local port, remote port, inode) of every TCP socket in this network namespace."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, remote, inode = fields[1], fields[2], int(fields[9])
                rows.append(
                    (int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16), inode)
                )
    return rows


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:  # it ended, or the fd closed, while we looked
        pass
    return inodes


def ssh_connection_pids(client_pid: int, port: int = SSH_PORT) -> list[int]:
    """The sshd processes serving `client_pid`'s SSH connections to `port` on this host (the
    listener itself, which may hold a connection for a moment after accepting it, never)."""
    listener = _listener_pid()
    sockets = _tcp_sockets()
    mine = _socket_inodes(client_pid)
    client_ports = {local for local, remote, inode in sockets if inode in mine and remote == port}
    served = {inode for local, remote, inode in sockets if local == port and remote in client_ports}
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
        pid = int(entry)
        if comm != "sshd" or pid == listener or b"[listener]" in _cmdline(pid):
            continue
        if _socket_inodes(pid) & served:
            pids.append(pid)
    return pids


def _listener_pid() -> int | None:
    try:
        return int((SSH_DIR / "sshd.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def kill_ssh_connections(client_pid: int) -> bool:
    """SIGKILL the sshd side of every SSH connection `client_pid` holds; whether there was one."""
    pids = ssh_connection_pids(client_pid)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return bool(pids)


@contextmanager
def min_job_age(seconds: int) -> Iterator[None]:
    """The cluster restarted with MinJobAge=seconds, and restored to the default after."""
    slurm_script("slurm-up", "--restart", env={"KLIQUE_SLURM_MIN_JOB_AGE": str(seconds)})
    try:
        yield
    finally:
        slurm_script("slurm-up", "--restart", env={"KLIQUE_SLURM_MIN_JOB_AGE": "300"})


def kill_job_hard(job_id: str) -> bool:
    """SIGKILL a running job's runner first (so it writes no exit file), then the rest."""
    pids = job_pids(job_id)
    runners = [p for p in pids if b"klique-runner" in _cmdline(p)]
    for pid in [*runners, *(p for p in pids if p not in runners)]:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return bool(runners)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _kill_when_running(run: ChaosRun, task_id: int) -> list[str]:
    """Kill a task's job hard once its runner runs; problems if it cannot be done."""

    def runner_up() -> str | None:
        task = run.tasks()[task_id]
        if not task.native_id or task.state is not TaskState.RUNNING:
            return None
        try:
            pids = job_pids(task.native_id)
        except RuntimeError:
            return None
        return task.native_id if any(b"klique-runner" in _cmdline(p) for p in pids) else None

    try:
        job_id = wait_for(runner_up, 120, f"task {task_id}'s runner to run", interval=0.2)
    except AssertionError as exc:
        return [str(exc)]
    return [] if kill_job_hard(job_id) else [f"task {task_id}: no runner to kill in {job_id}"]


def _lost_reasons(run: ChaosRun) -> list[str]:
    """A lost task must say why: no exit file from the runner."""
    return [
        f"task {t.id} is lost without saying why: {t.reason!r}"
        for t in run.tasks().values()
        if t.state is TaskState.LOST and "no exit file" not in t.reason
    ]


def hard_kills(workdir: Path, lost_after: int = 15) -> Outcome:
    """Jobs killed so hard that no exit file is written end LOST with a reason once the grace
    period is over, while Slurm still lists them; their neighbours end as they should."""
    started = time.monotonic()
    problems: list[str] = []
    with chaos_run("hard-kill", workdir, lost_after=f"{lost_after}s") as run:
        run.launch()
        victims = run.submit([Work(u, ("sleep", "300"), LOST) for u in USERS])
        run.submit(mixed_work(6))
        for task_id in victims:
            problems += _kill_when_running(run, task_id)
        if not run.wait_final(lost_after + 120):
            problems.append("not every task ended")
        problems += _lost_reasons(run)
        run.stop()
        outcome = run.account("hard-kill", len(victims), started)
    outcome.problems += problems
    return outcome


def short_min_job_age(workdir: Path, tasks: int = 40, lost_after: int = 15) -> Outcome:
    """MinJobAge=2: jobs leave the queue two seconds after they end, so the exit file (then
    sacct) decides; with a crash after a submission and one job killed hard."""
    started = time.monotonic()
    problems: list[str] = []
    with min_job_age(2), chaos_run("min-job-age", workdir, lost_after=f"{lost_after}s") as run:
        run.queue(mixed_work(tasks))
        (victim,) = run.queue([Work("bob", ("sleep", "300"), LOST)])
        run.launch("after_submit:6")
        run.await_crash("after_submit:6")
        # The jobs of the tasks left PLACED end and leave the queue before the restart: only
        # their exit files can tell the restarted server that they ran. (The crash comes after
        # the whole batch was submitted, so the victim's job may be among them: it runs on, and
        # the restarted server finds it by its tag.)
        placed = {t.tag for t in run.in_state(TaskState.PLACED)} - {run.tasks()[victim].tag}
        submitted = placed & set(run.jobs())
        if not submitted:
            problems.append("after_submit:6: no PLACED task had a job: the window was missed")
        wait_for(
            lambda: not submitted & _in_queue() or cluster_min_job_age() != 2,
            180,
            "the jobs to leave the queue",
            interval=0.2,
        )
        run.launch()
        problems += _kill_when_running(run, victim)
        if not run.wait_final(lost_after + 180):
            problems.append("not every task ended")
        problems += _lost_reasons(run)
        run.stop()
        by_file = [t.id for t in run.tasks().values() if t.tag in submitted and not t.native_id]
        if cluster_min_job_age() != 2:
            problems.append(
                f"the cluster's MinJobAge became {cluster_min_job_age()} during the scenario: "
                "another session's scripts/slurm-up restarted it, so this run proves nothing"
            )
        outcome = run.account("min-job-age-2", 3, started)
    outcome.problems += problems
    outcome.notes.append(
        f"{len(submitted)} unknown submissions whose jobs had left the queue, "
        f"{len(by_file)} of them found by their exit file"
    )
    if len(by_file) != len(submitted):
        outcome.problems.append(f"found by exit file: {by_file}, of {sorted(submitted)}")
    return outcome


# The database: a process killed inside a state change's transaction.

_DIE_INSIDE = """
import os, signal, sys
from sqlalchemy import event
from broker.domain import TaskState
from broker.store.repository import Store

url, task_id, target, where = sys.argv[1:5]
store = Store(url)

def die(*_args):
    os.kill(os.getpid(), signal.SIGKILL)

def after_update(conn, cursor, statement, parameters, context, executemany):
    if statement.lstrip().upper().startswith("UPDATE TASKS"):
        die()

if where == "after_update":
    event.listen(store.engine, "after_cursor_execute", after_update)
else:  # every statement of the change ran; the COMMIT is next
    event.listen(store.engine, "commit", die)
store.change_state(int(task_id), TaskState(target), "written by a process that dies first")
print("the change committed", flush=True)
"""

# (from, to, where the process dies): a start (a ledger row begins), an end (it closes).
_STORE_CHANGES = (
    (TaskState.SUBMITTED, TaskState.RUNNING, "after_update"),
    (TaskState.SUBMITTED, TaskState.RUNNING, "before_commit"),
    (TaskState.RUNNING, TaskState.COMPLETED, "after_update"),
    (TaskState.RUNNING, TaskState.COMPLETED, "before_commit"),
)


def _snapshot(store: Store, task_id: int) -> tuple[Any, ...]:
    task = store.get(task_id)
    ledger = [(r.start, r.end) for r in store.ledger() if r.task_id == task_id]
    return (
        task.state,
        task.reason,
        task.started_at,
        task.finished_at,
        len(store.events(task_id)),
        ledger,
    )


def store_crash(url: str, label: str) -> Outcome:
    """A process SIGKILLed inside Store.change_state (after its UPDATE, or with every statement
    run and only the COMMIT left) leaves the previous state, its events and its ledger."""
    started = time.monotonic()
    outcome = Outcome(f"store-crash-{label}", 0, 0)
    store = Store.open(url)
    try:
        for before, after, where in _STORE_CHANGES:
            task = store.create_task(TaskSpec(("true",), "cpu", name="chaos store"), "alice", None)
            for step in (TaskState.PLACED, TaskState.SUBMITTED, TaskState.RUNNING):
                if store.get(task.id).state is before:
                    break
                store.change_state(task.id, step, native_id="1", job_dir="/nowhere", pool="p")
            outcome.tasks += 1
            was = _snapshot(store, task.id)
            child = subprocess.run(
                [sys.executable, "-c", _DIE_INSIDE, url, str(task.id), after.value, where],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=ROOT,
                check=False,
            )
            if child.returncode != -signal.SIGKILL:
                raise RuntimeError(f"the writer did not die inside the change: {child}")
            outcome.faults += 1
            now = _snapshot(store, task.id)
            if now != was:
                outcome.wrong_final += 1
                outcome.problems.append(f"{before}->{after} killed {where}: {was} became {now}")
            # The dead writer's locks are gone: the same change goes through at once.
            moved = store.change_state(task.id, after, "written after the crash")
            if moved is None or moved.state is not after:
                outcome.problems.append(f"{before}->{after} cannot be made after the crash")
    finally:
        store.close()
    outcome.seconds = time.monotonic() - started
    return outcome


def fresh_postgres_schema(url: str) -> tuple[str, Callable[[], None]]:
    """A new schema on the test PostgreSQL server, and how to drop it."""
    import sqlalchemy

    from broker.store.engine import normalise_url

    schema = f"chaos_{os.getpid()}_{time.time_ns() % 10**9}"
    engine = sqlalchemy.create_engine(normalise_url(url))
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")

    def drop() -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        engine.dispose()

    return f"{url}?options=-csearch_path%3D{schema}", drop


def foreign_tag(workdir: Path) -> Outcome:
    """Another installation's job carries the tag of a task whose submission's outcome is
    unknown, under the same account: the task must not take it for its own."""
    started = time.monotonic()
    problems: list[str] = []
    with chaos_run("foreign-tag", workdir) as run:
        ids = run.queue([Work("alice", ("true",), COMPLETED), Work("bob", ("true",), COMPLETED)])
        for task_id, owner in zip(ids, ("alice", "bob"), strict=True):
            elsewhere = run.job_root / "elsewhere" / f"klique-{task_id}"
            elsewhere.mkdir(parents=True, mode=0o777)
            for folder in (elsewhere.parent, elsewhere):
                os.chmod(folder, 0o1777)
            script = elsewhere / "job.sh"
            script.write_text("#!/bin/sh\necho another installation ran this\n")
            script.chmod(0o755)
            run.foreign.add(
                sbatch(
                    owner,
                    f"--job-name=klique-{task_id}",
                    f"--output={elsewhere}/%j.out",
                    str(script),
                )
            )
        wait_for(
            lambda: _states(run.foreign) == {"COMPLETED"},
            60,
            "the foreign jobs to end",
            interval=0.2,
        )
        run.launch("before_submit:1")
        run.await_crash("before_submit:1")
        run.launch()
        if not run.wait_final(90):
            problems.append("not every task ended")
        for task in run.tasks().values():
            if task.native_id in {str(j) for j in run.foreign}:
                problems.append(f"task {task.id} took the foreign job {task.native_id} for its own")
        run.stop()
        outcome = run.account("foreign-tag", 1, started)
    outcome.problems += problems
    return outcome


def _in_queue() -> set[str]:
    """The names of the jobs squeue lists now, finished ones included."""
    listing = _run(["squeue", "--states=all", "--noheader", "--format=%j"])
    return set(listing.split())


def _states(job_ids: set[int]) -> set[str]:
    listing = _run(
        [
            "squeue",
            "--states=all",
            "--noheader",
            "--format=%i|%T",
            f"--jobs={','.join(map(str, job_ids))}",
        ]
    )
    return {line.split("|")[1] for line in listing.split() if "|" in line}


# sbatch as it answers when its exchange with slurmctld breaks: it runs the real sbatch (the
# job exists in Slurm) and then reports the receive failure that _remap_slurmctld_errno
# (src/common/slurm_protocol_api.c) gives a lost reply; or, for the request itself lost, it
# reports that failure without running it. Each fault is a ticket (a folder made once, by
# whichever account's sbatch takes it first).
LOSSY_SBATCH = """#!/bin/sh
for i in $(seq 1 {replies}); do
  if mkdir "{tickets}/reply-$i" 2>/dev/null; then
    {sbatch} "$@" >/dev/null 2>&1
    echo "sbatch: error: Batch job submission failed: {lost}" >&2
    exit 1
  fi
done
for i in $(seq 1 {requests}); do
  if mkdir "{tickets}/request-$i" 2>/dev/null; then
    echo "sbatch: error: Batch job submission failed: {timed_out}" >&2
    exit 1
  fi
done
exec {sbatch} "$@"
"""


def lost_submit_replies(
    workdir: Path, tasks: int = 24, replies: int = 6, requests: int = 3
) -> Outcome:
    """sbatch's reply lost after slurmctld queued the job (`replies` times), and the request
    lost before it (`requests` times): every task whose job exists is adopted by its tag,
    every other one goes again after two looks a MessageTimeout apart; Slurm's own records
    show one job per task, and every task ends as its command says."""
    started = time.monotonic()
    problems: list[str] = []
    with chaos_run("lost-replies", workdir) as run:
        bin_dir = run.job_root / "lossy-bin"
        tickets = run.job_root / "lossy-tickets"
        for folder in (bin_dir, tickets):
            folder.mkdir()
            os.chmod(folder, 0o1777)
        real = shutil.which("sbatch")
        assert real, "sbatch is not on PATH"
        wrapper = bin_dir / "sbatch"
        wrapper.write_text(
            LOSSY_SBATCH.format(
                replies=replies,
                requests=requests,
                tickets=tickets,
                sbatch=real,
                lost="Unable to contact slurm controller (receive failure)",
                timed_out="Socket timed out on send/recv operation",
            )
        )
        wrapper.chmod(0o755)
        run.env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
        run.launch()
        run.submit(mixed_work(tasks))
        if not run.wait_final(300):
            problems.append("not every task ended within 300 s")
        taken = len(list(tickets.iterdir()))
        if taken != replies + requests:
            problems.append(f"{taken} of {replies + requests} lost exchanges happened")
        log = (run.home / "server.log").read_text(errors="replace")
        if "submission outcome unknown" not in log:
            problems.append("no submission's outcome was unknown: the fault was missed")
        run.stop()
        outcome = run.account("lost-submit-replies", taken, started)
    outcome.problems += problems
    return outcome
