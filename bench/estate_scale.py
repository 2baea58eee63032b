"""The control plane under an estate's load: 10 clusters, each behind its own `klique agent`
process over HTTP (as on login nodes): the real Slurm of the tests, and three each of the PBS
Professional, Torque and LSF simulators of tests/fakes (tests/fakes has no Slurm-like simulator).
N active tasks on each (default 1,000: 10,000 running and pending at once) and a steady stream
of creates and ends, for --minutes (default 10).

The simulators run two jobs at a time (KLIQUE_SIM_CPUS=2): the rest wait in their queues. On
the real Slurm, the load's tasks ask `--begin=now+3hours` (a compute resource's
extra_directives): they wait in Slurm's queue without taking the node, which the latency probes
and the other users of the test cluster need.

Measured over the steady window (after every load task has reached its cluster):
- the control plane's CPU (cores; median and p99 of one-second samples from /proc) and its
  resident memory; the agents' CPU beside it;
- status queries per cluster per look, from /metrics (klique_pool_status_queries_total over
  klique_pool_looks_total), and the status commands the clusters actually ran per look
  (a counting wrapper in front of squeue, qstat and bjobs);
- submit -> running on the real Slurm: a probe task through Klique (POST to its runner's start)
  against a bare `sbatch` (call to the job's first command), in turns;
- API p99 for create (the stream's), list (`GET /tasks?limit=200&all_users=true`) and show,
  and the web UI's task list (`GET /tasks`, signed in);
- the store's size (SQLite: the database and its WAL).

Usage: bench/estate_scale.py [--minutes 10] [--jobs-per-cluster 1000] [--rate 2]
Last line: JSON with the figures and the goals beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from _common import ROOT, cpu_seconds, klique_server, last_line
from prometheus_client.parser import text_string_to_metric_families
from ui_tasks import browser_session

from broker.domain import TaskSpec, TaskState
from broker.store.repository import Store

ACCOUNT = "alice"
FAKES = ROOT / "tests" / "fakes"
PYTHON = "/usr/bin/python3"
SIMS = [f"{flavor}-{i}" for flavor in ("pbspro", "torque", "lsf") for i in (1, 2, 3)]
CLUSTERS = ["slurm", *SIMS]
PROGRAMS = {
    "slurm": ("sbatch", "squeue", "scancel"),
    "pbspro": ("qsub", "qstat", "qdel", "qrerun"),
    "torque": ("qsub", "qstat", "qdel"),
    "lsf": ("bsub", "bjobs", "bkill", "brequeue"),
}
STATUS = {"slurm": ("squeue",), "pbspro": ("qstat",), "torque": ("qstat",), "lsf": ("bjobs",)}
SIM_ENV = {"KLIQUE_SIM_CPUS": "2", "KLIQUE_SIM_KILL_DELAY": "1"}
GOALS = {"cpu_cores": 0.5, "queries_per_look": 1, "slurm_over_sbatch_s": 0.5, "api_p99_ms": 100}
PROBE_EVERY_S = 5.0
THERE = ("submitted", "pending", "running")  # a task at its cluster
FINAL = {"completed", "failed", "cancelled", "timeout", "lost"}


def flavor(cluster: str) -> str:
    return cluster.split("-")[0]


def login_node(work: Path, cluster: str) -> Path:
    """A bin folder standing in for the cluster's login node: its scheduler's commands (the
    simulators bound to a state folder of their own), each status command counted first."""
    kind = flavor(cluster)
    bin_dir = work / cluster / "bin"
    bin_dir.mkdir(parents=True)
    count = work / cluster / "status-calls"
    count.touch()
    count.chmod(0o666)  # the commands run as the mapped account
    for program in PROGRAMS[kind]:
        target = shutil.which(program) if kind == "slurm" else str(FAKES / kind / program)
        lines = ["#!/bin/sh"]
        if kind != "slurm":
            sim = {"KLIQUE_SIM_DIR": str(work / cluster / "sim"), **SIM_ENV}
            lines += [f"export {k}='{v}'" for k, v in sim.items()]
        if program in STATUS[kind]:
            lines.append(f"echo x >>'{count}'")
        lines.append(f"exec '{target}' \"$@\"")
        (bin_dir / program).write_text("\n".join(lines) + "\n")
        (bin_dir / program).chmod(0o755)
    return bin_dir


def estate(work: Path, jobs: int) -> str:
    """One load resource per cluster, a probe resource on Slurm, every pool `agent: remote`."""
    resources, pools = [], []
    for cluster in CLUSTERS:
        extra = ', extra_directives: ["--begin=now+3hours"]' if cluster == "slurm" else ""
        resources.append(
            f"  load-{cluster}: {{profile: {{cpus: 1, memory: 100M, walltime: 2h, "
            f"pools: [{cluster}]}}{extra}}}"
        )
        kind = {"slurm": "slurm", "pbspro": "pbs", "torque": "pbs", "lsf": "lsf"}[flavor(cluster)]
        settings = {
            "kind": kind,
            "agent": "remote",
            "job_root": str(work / cluster / "jobs"),
            "python": PYTHON,
            "max_queued": jobs + 50,
            "poll_interval": "5s",
            "lost_after": "10m",
            "user_map": {"admin": ACCOUNT},
        }
        if kind == "slurm":
            settings["partition"] = "debug"
        if flavor(cluster) == "torque":
            settings["dialect"] = "torque"
        pools.append(f"  {cluster}: {json.dumps(settings)}")
    probe = "  probe: {profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [slurm]}}"
    return "resources:\n" + "\n".join([*resources, probe]) + "\npools:\n" + "\n".join(pools) + "\n"


def seed_ids(home: Path, base: int) -> None:
    """Task ids from `base`, which no other run on the shared Slurm uses: every job's tag
    (klique-<id>) names only this run's jobs (as tests/chaos/chaos_scenarios.py does)."""
    store = Store.open(f"sqlite:///{home / 'klique.db'}")
    try:
        seed = store.create_task(
            TaskSpec(("true",), "probe", name="bench: where ids start"),
            "bench",
            None,
            state=TaskState.CANCELLED,
            reason="placeholder",
        )
    finally:
        store.close()
    with sqlite3.connect(home / "klique.db") as db:  # a benchmark's fixture, not the store's way
        db.execute("UPDATE task_events SET task_id = ? WHERE task_id = ?", (base, seed.id))
        db.execute("UPDATE tasks SET id = ? WHERE id = ?", (base, seed.id))


@contextmanager
def agents(api: httpx.Client, work: Path, server: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`klique agent --pool NAME` for every cluster, each with its login node's PATH."""
    started = []
    try:
        for cluster in CLUSTERS:
            token = api.post("/agent-tokens", json={"pools": [cluster]}).json()["token"]
            home = work / cluster / "agent"
            home.mkdir(mode=0o700)
            (home / "token").write_text(token)
            path = f"{work / cluster / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
            env = {**os.environ, "KLIQUE_HOME": str(home), "PATH": path}
            argv = [sys.executable, "-m", "broker", "agent", "--pool", cluster]
            argv += ["--server", server, "--token-file", str(home / "token")]
            with (home / "agent.log").open("ab") as log:
                started.append(
                    subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
                )
        yield started
    finally:
        for agent in started:
            agent.terminate()
        for agent in started:
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                agent.kill()


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(base + "/metrics", timeout=60).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def per_pool(samples: dict[Any, float], name: str) -> dict[str, float]:
    return {dict(labels)["pool"]: v for (n, labels), v in samples.items() if n == name}


def delta(before: dict[Any, float], after: dict[Any, float], name: str) -> dict[str, float]:
    """A per-pool counter's growth over the window."""
    was = per_pool(before, name)
    return {pool: value - was.get(pool, 0.0) for pool, value in per_pool(after, name).items()}


def in_states(samples: dict[Any, float], *states: str) -> int:
    """How many tasks are in these states, over every pool."""
    return int(
        sum(
            value
            for (name, labels), value in samples.items()
            if name == "klique_tasks" and dict(labels)["state"] in states
        )
    )


def ramp(api: httpx.Client, base: str, jobs: int, deadline_s: float) -> float:
    """N load tasks on every cluster, in batches; how long until all reached their clusters."""
    started = time.monotonic()
    body = {"command": ["sleep", "7200"]}
    for cluster in CLUSTERS:
        for first in range(0, jobs, 100):
            batch = [{**body, "resource": f"load-{cluster}"}] * min(100, jobs - first)
            answer = api.post("/tasks/batch", json={"tasks": batch})
            answer.raise_for_status()
    # Done when none is left to reach its cluster (a few may have ended on the way).
    while waiting := in_states(samples := scrape(base), "queued", "placed"):
        there = in_states(samples, *THERE)
        if time.monotonic() - started > deadline_s:
            print(f"ramp: {waiting} tasks still on their way after {deadline_s:.0f} s")
            break
        print(f"ramp: {there} at their clusters, {waiting} on their way", flush=True)
        time.sleep(10)
    return time.monotonic() - started


class Timings:
    """Latencies by name, from threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, list[float]] = {}

    def timed(self, name: str, call: Callable[[], httpx.Response]) -> httpx.Response:
        t0 = time.perf_counter()
        answer = call()
        with self.lock:
            self.seen.setdefault(name, []).append(time.perf_counter() - t0)
        return answer

    def p99_ms(self, name: str) -> float | None:
        values = sorted(self.seen.get(name, []))
        return round(values[int(0.99 * (len(values) - 1))] * 1000, 1) if values else None


def stream(api: httpx.Client, timings: Timings, rate: float, stop: threading.Event) -> int:
    """Creates and ends at `rate` a second each: a new load task on a cluster in turn, and
    the cancel of that cluster's oldest (cancels wait for the pool: off this thread)."""
    made = 0
    with ThreadPoolExecutor(4) as cancels:
        while not stop.wait(1 / rate):
            cluster = CLUSTERS[made % len(CLUSTERS)]
            body = {"command": ["sleep", "7200"], "resource": f"load-{cluster}"}
            timings.timed("create", lambda body=body: api.post("/tasks", json=body))
            made += 1
            oldest = api.get("/tasks", params={"limit": 1, "state": "pending"}).json()
            if oldest:
                task_id = oldest[0]["id"]
                cancels.submit(lambda t=task_id: api.post(f"/tasks/{t}/cancel"))
    return made


def readers(api: httpx.Client, ui: httpx.Client, timings: Timings, stop: threading.Event) -> None:
    """A user's reads, a few a second: the API's list and a task's page, the web UI's list."""
    shown = api.get("/tasks", params={"limit": 200, "all_users": "true"}).json()
    ids = [t["id"] for t in shown] or [1]
    while not stop.wait(0.3):
        listed = timings.timed(
            "list", lambda: api.get("/tasks", params={"limit": 200, "all_users": "true"})
        )
        ids = [t["id"] for t in listed.json()] or ids
        task_id = random.choice(ids)
        timings.timed("show", lambda t=task_id: api.get(f"/tasks/{t}"))
        timings.timed("ui_list", lambda: ui.get("/tasks"))


def sampler(pids: list[int], stop: threading.Event, out: dict[str, list[float]]) -> None:
    """Once a second: the server's cores (from /proc), its resident memory, the agents'
    cores together."""
    server, agents_ = pids[0], pids[1:]
    last = (time.monotonic(), cpu_seconds(server), sum(cpu_seconds(p) for p in agents_))
    while not stop.wait(1.0):
        now = (time.monotonic(), cpu_seconds(server), sum(cpu_seconds(p) for p in agents_))
        span = now[0] - last[0]
        out["server"].append((now[1] - last[1]) / span)
        out["agents"].append((now[2] - last[2]) / span)
        status = Path(f"/proc/{server}/status").read_text()
        rss_kb = next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")
        )
        out["rss_mb"].append(rss_kb / 1024)
        last = now


def bare_sbatch(work: Path, i: int) -> float:
    stamp = work / "slurm" / "jobs" / f"bare-{i}.start"
    argv = ["runuser", "-u", ACCOUNT, "--", "sbatch", "--parsable", "--job-name=bench-scale"]
    argv += [f"--output={work / 'slurm' / 'jobs'}/bare-%j.out", "--wrap", f"date +%s.%N > {stamp}"]
    t0 = time.time()
    subprocess.run(argv, capture_output=True, text=True, check=True, cwd=work / "slurm" / "jobs")
    deadline = time.monotonic() + 120
    while not (text := stamp.read_text().strip() if stamp.exists() else ""):
        if time.monotonic() > deadline:
            raise SystemExit("a bare sbatch job did not start in 120 s")
        time.sleep(0.005)
    return float(text) - t0


def klique_probe(api: httpx.Client, accepted: list[float]) -> float:
    """POST -> the runner's start; `accepted` gets POST -> sbatch's answer (Klique's share)."""
    t0 = time.time()
    task = api.post("/tasks", json={"command": ["true"], "resource": "probe"}).json()
    deadline = time.monotonic() + 120
    while not (seen := api.get(f"/tasks/{task['id']}").json())["started_at"]:
        if seen["state"] in FINAL or time.monotonic() > deadline:
            raise SystemExit(f"probe {task['id']} did not start: {seen['state']} {seen['reason']}")
        time.sleep(0.005)
    accepted.append(float(seen["submitted_at"]) - t0)
    return float(seen["started_at"]) - t0


def probes(
    api: httpx.Client, work: Path, stop: threading.Event, out: dict[str, list[float]]
) -> None:
    """Submit -> running on the real Slurm, Klique and a bare sbatch in turns."""
    i = 0
    while not stop.wait(PROBE_EVERY_S):
        out["sbatch"].append(bare_sbatch(work, i))
        out["klique"].append(klique_probe(api, out["accepted"]))
        print(
            f"probe {i + 1}: sbatch {out['sbatch'][-1]:.3f} s, Klique {out['klique'][-1]:.3f} s "
            f"(sbatch accepted it at {out['accepted'][-1]:.3f} s)",
            flush=True,
        )
        i += 1


def cancel_slurm_leftovers(first_id: int) -> None:
    """This run's Slurm jobs (by their tags) and its bare ones: none outlives the bench."""
    listed = subprocess.run(
        ["squeue", "-h", "-u", ACCOUNT, "-o", "%i %j"], capture_output=True, text=True, check=False
    ).stdout.split("\n")
    mine = []
    for line in listed:
        job, _, name = line.partition(" ")
        tag = name.removeprefix("klique-")
        if name == "bench-scale" or (tag.isdigit() and int(tag) >= first_id):
            mine.append(job)
    for start in range(0, len(mine), 500):
        subprocess.run(["scancel", *mine[start : start + 500]], check=False)


def end_jobs(work: Path) -> None:
    """The simulators' jobs still running (a supervisor that missed its folder's removal), by
    their ids: every process whose command line names this run's folder, and its children."""
    mine = str(work).encode()
    for entry in Path("/proc").iterdir():
        try:
            named = mine in (entry / "cmdline").read_bytes()
            children = (entry / "task" / entry.name / "children").read_text().split()
        except (OSError, ValueError):
            continue
        mine_too = named and entry.name.isdigit() and int(entry.name) != os.getpid()
        for pid in [entry.name, *children] if mine_too else []:
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))] if ordered else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--jobs-per-cluster", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=2.0, help="creates (and ends) a second")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the clean-up below runs
    work = Path(tempfile.mkdtemp(prefix="klique-scale-", dir="/tmp"))
    work.chmod(0o755)
    for cluster in CLUSTERS:
        login_node(work, cluster)
        for folder in ("jobs", "sim"):  # the mapped account's to write
            (work / cluster / folder).mkdir()
            (work / cluster / folder).chmod(0o1777)
    first_id = int(time.time()) % 2_000_000 * 1000 + 500_000_000
    prepare = lambda home: seed_ids(home, first_id)  # noqa: E731
    try:
        with klique_server(estate(work, args.jobs_per_cluster), prepare=prepare) as (api, home):
            base = str(api.base_url).removesuffix("/").removesuffix("/api/v1")
            server_pid = int((home / "bench-server.pid").read_text())
            with agents(api, work, base) as started:
                ramp_s = ramp(api, base, args.jobs_per_cluster, deadline_s=900)
                result = steady(
                    api, base, home, work, [server_pid, *(a.pid for a in started)], args
                )
                result["ramp_s"] = round(ramp_s, 1)
    finally:
        cancel_slurm_leftovers(first_id)
        shutil.rmtree(work, ignore_errors=True)  # the simulators' servers go with their folders
        end_jobs(work)
    last_line(result)


def steady(
    api: httpx.Client, base: str, home: Path, work: Path, pids: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    timings = Timings()
    ui = browser_session(base, (home / "admin.token").read_text().strip())
    stop = threading.Event()
    cpu: dict[str, list[float]] = {"server": [], "agents": [], "rss_mb": []}
    latency: dict[str, list[float]] = {"sbatch": [], "klique": [], "accepted": []}
    calls_before = {c: len((work / c / "status-calls").read_text().split()) for c in CLUSTERS}
    before = scrape(base)
    threads = [
        threading.Thread(target=sampler, args=(pids, stop, cpu)),
        threading.Thread(target=readers, args=(api, ui, timings, stop)),
        threading.Thread(target=probes, args=(api, work, stop, latency)),
    ]
    for thread in threads:
        thread.start()
    made: list[int] = []
    creates = threading.Thread(target=lambda: made.append(stream(api, timings, args.rate, stop)))
    creates.start()
    time.sleep(args.minutes * 60)
    stop.set()
    for thread in [*threads, creates]:
        thread.join()
    created = made[0] if made else 0
    after = scrape(base)
    looks = delta(before, after, "klique_pool_looks_total")
    queries = delta(before, after, "klique_pool_status_queries_total")
    calls = {
        c: len((work / c / "status-calls").read_text().split()) - calls_before[c] for c in CLUSTERS
    }
    per_look = {c: round(queries[c] / looks[c], 2) for c in CLUSTERS if looks.get(c)}
    calls_per_query = {c: round(calls[c] / queries[c], 2) for c in CLUSTERS if queries.get(c)}
    store_mb = sum(f.stat().st_size for f in home.glob("klique.db*")) / 2**20
    sbatch_s = statistics.median(latency["sbatch"]) if latency["sbatch"] else None
    klique_s = statistics.median(latency["klique"]) if latency["klique"] else None
    figures = {
        "clusters": len(CLUSTERS),
        "jobs_per_cluster": args.jobs_per_cluster,
        "minutes": args.minutes,
        "tasks_active": in_states(after, *THERE),
        "stream_creates": created,
        "server_cpu_cores_median": round(statistics.median(cpu["server"]), 3),
        "server_cpu_cores_p99": round(p(cpu["server"], 0.99), 3),
        "agents_cpu_cores_median": round(statistics.median(cpu["agents"]), 3),
        "server_rss_mb_max": round(max(cpu["rss_mb"]), 1),
        "status_queries_per_look": per_look,
        "status_commands_per_query": calls_per_query,
        "looks": looks,
        "slurm_submit_to_running_klique_median_s": klique_s and round(klique_s, 3),
        "slurm_submit_to_running_sbatch_median_s": sbatch_s and round(sbatch_s, 3),
        "slurm_klique_post_to_sbatch_accepted_median_s": latency["accepted"]
        and round(statistics.median(latency["accepted"]), 3),
        "slurm_probes": len(latency["klique"]),
        "api_create_p99_ms": timings.p99_ms("create"),
        "api_list_p99_ms": timings.p99_ms("list"),
        "api_show_p99_ms": timings.p99_ms("show"),
        "ui_task_list_p99_ms": timings.p99_ms("ui_list"),
        "store_mb": round(store_mb, 1),
        "goals": GOALS,
    }
    for key, value in figures.items():
        print(f"{key:42} {value}", flush=True)
    return figures


if __name__ == "__main__":
    main()
