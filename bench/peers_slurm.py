"""N trivial tasks on the Slurm cluster through Klique and through its peers, in one run: a plain
sbatch loop, one plain job array (`sbatch --array`, the floor of every tool that submits one),
submitit (a loop of executor.submit, and executor.map_array), PSI/J's Slurm executor, Klique one
task a request (as `klique submit` does), and Klique as one sweep (POST /sweeps, as
`klique submit --sweep/--grid` does).

For each tool, from its first submission: `accepted_s`, until every job has a Slurm job id (the
peers: their submit calls have returned; Klique: the API lists every task past `placed`, with
its native id, asked every 20 ms), and `done_s`, until the tool itself says every task has ended
(sbatch loop and array: squeue lists none of their jobs pending, running or completing; submitit:
job.done(); PSI/J: job.wait(); Klique: the API shows every task in a final state; the loop's
squeue and Klique's API asked every 0.5 s). Beside them, from Slurm's job completion log, when
Slurm ended the tool's last job (`slurm_last_end_s`, to the whole second that log keeps). The
tools run one after another, each on a queue empty of this benchmark's jobs; every job asks for
partition debug, one CPU, 100 MB and ten minutes, and runs `true` (submitit runs a Python function
that prints a line).

The peers run as alice, as their users would: submitit and PSI/J call sbatch/squeue themselves,
from a Python alice can run. That is the venv in $KLIQUE_BENCH_PEERS_VENV (default
/tmp/klique-bench-peers); if it lacks submitit or psij-python, this script makes it with
/usr/bin/python3 -m venv and pip (the packages of `pip install -e '.[bench]'`).

Usage: bench/peers_slurm.py [TASKS] [--tools TOOL,...] [--rounds K] (default 500, every tool,
in the order above, once; with K rounds, every figure is the median of K, and `done_s_each`
lists each round's). Last line: {"sbatch_loop": {"accepted_s", "done_s"}, ...,
"klique_sweep": {...}, "tasks", "rounds", "klique_sweep_done_ratio",
"klique_sweep_accepted_ratio", "klique_sweep_to_array_ratio"}; a ratio is the best peer's
time over the Klique sweep's (above 1: Klique is faster), among the tools that ran, the plain
array aside (a floor, not a tool: it is accepted in milliseconds); the last, the plain array's
done_s over the sweep's.

slurmctld keeps a finished job's record for MinJobAge (300 s by default, as here), and every
squeue loads them all: a tool that runs later meets the records of those before it (about
3,000 for the Klique sweep when every tool runs). `--tools sbatch_loop,klique_sweep` compares
the two on a queue that holds only the loop's.

What bounds every tool here is when slurmctld starts jobs (Slurm 22.05): in scheduling passes,
which a submission or a job's end asks for at the next tick of its one-second background loop
(`queue_job_scheduler()`), and which the node's epilog message runs at once
(`_slurm_rpc_epilog_complete`). On this 16-CPU node a tick starts 16 one-CPU jobs, and an extra
pass starts more only where jobs have already ended: the shorter a job, the more of them. A job
of the loop or of the plain array takes 0.09 s from its allocation to its end; a Klique element
about 0.4 s (its runner and its report, 16 at once on two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from _common import ROOT, klique_server, last_line, slurm_estate

ACCOUNT = "alice"
WORK = Path(os.environ.get("KLIQUE_SLURM_DIR", "/tmp/klique-slurm")) / "work"
JOBCOMP = Path(os.environ.get("KLIQUE_SLURM_DIR", "/tmp/klique-slurm")) / "log" / "jobcomp.txt"
PEERS_VENV = Path(os.environ.get("KLIQUE_BENCH_PEERS_VENV", "/tmp/klique-bench-peers"))
PEER_PY = PEERS_VENV / "bin" / "python"
PEER_PACKAGES = ["submitit>=1.5,<2", "psij-python>=0.9,<1"]
RESOURCES = ["--partition=debug", "--cpus-per-task=1", "--mem=100M", "--time=00:10:00"]
PEERS = ("sbatch_loop", "sbatch_array", "submitit_loop", "submitit_map_array", "psij")
KLIQUE = ("klique_one_by_one", "klique_sweep")


def _arguments() -> tuple[int, tuple[str, ...], int]:
    """TASKS, the tools to run in their order above, and how many rounds of them."""
    parser = argparse.ArgumentParser(description="N trivial tasks through Klique and its peers")
    parser.add_argument("tasks", nargs="?", type=int, default=500, help="tasks a tool (500)")
    parser.add_argument("--tools", default=",".join(PEERS + KLIQUE), help="which, comma-separated")
    parser.add_argument("--rounds", type=int, default=1, help="every tool this many times (1)")
    arguments = parser.parse_args()
    if arguments.rounds < 1:
        parser.error("--rounds: at least 1")
    chosen = set(arguments.tools.split(","))
    if chosen - set(PEERS + KLIQUE):
        unknown, known = ", ".join(sorted(chosen - set(PEERS + KLIQUE))), ", ".join(PEERS + KLIQUE)
        parser.error(f"no such tool: {unknown} (the tools: {known})")
    return arguments.tasks, tuple(t for t in PEERS + KLIQUE if t in chosen), arguments.rounds


TASKS, TOOLS, ROUNDS = _arguments()
FINAL = {"completed", "failed", "cancelled", "timeout", "lost"}
NOT_FINAL = "created,queued,held,placed,submitted,pending,running"
NOT_YET = "created,queued,held,placed"
POLL_S = 0.5
# Klique's acceptance is seen through the API (one cheap request, `limit=1` or a sweep's
# states) where the peers' submit calls return: polled finely, so that it is not rounded up
# to POLL_S. Ends are polled at POLL_S for every tool that this script polls.
ACCEPTED_POLL_S = 0.02
DEADLINE_S = 900


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def as_account(*argv: str) -> list[str]:
    return ["runuser", "-u", ACCOUNT, "--", *argv]


def until(condition: Callable[[], bool], what: str, poll_s: float = POLL_S) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not after {DEADLINE_S} s")
        time.sleep(poll_s)


def peers_venv() -> None:
    """The peers' Python, which alice can run; made here if it lacks submitit or psij-python."""
    check = as_account(str(PEER_PY), "-c", "import submitit, psij")
    if subprocess.run(check, capture_output=True, check=False).returncode == 0:
        return
    say(f"making {PEERS_VENV} with {', '.join(PEER_PACKAGES)} (alice must be able to run it)")
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--clear", str(PEERS_VENV)], check=True)
    subprocess.run([str(PEER_PY), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(PEERS_VENV)], check=True)
    subprocess.run(check, check=True)


def queued(name: str) -> int:
    """How many of alice's jobs with this name are pending, running or completing."""
    argv = ["squeue", "--noheader", "--states=PD,R,CG", "--format=%i", "--array"]
    argv += [f"--user={ACCOUNT}", f"--name={name}"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return len(done.stdout.split())


def drain(what: str, name: str) -> None:
    until(lambda: queued(name) == 0, f"{what}'s jobs leaving the queue")


def cancel(name: str | None = None, ids: list[str] | None = None) -> None:
    """Cancel exactly this benchmark's jobs (other people's jobs on the cluster stay)."""
    if name is not None:
        subprocess.run(["scancel", f"--user={ACCOUNT}", f"--name={name}"], check=False)
    for i in range(0, len(ids or []), 200):
        subprocess.run(["scancel", *(ids or [])[i : i + 200]], check=False)


def slurm_ends(offset: int, t0: float, name: str | None, ids: set[str] | None) -> int | None:
    """Seconds from t0 (epoch) to the last EndTime Slurm logged for these jobs."""
    with JOBCOMP.open("rb") as log:
        log.seek(offset)
        lines = log.read().decode(errors="replace").splitlines()
    ends = []
    for line in lines:
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        job = fields.get("JobId")  # an array element: by its ARRAY_INDEX id, as Klique has it
        if "ArrayTaskId" in fields:
            job = f"{fields.get('ArrayJobId')}_{fields['ArrayTaskId']}"
        if (name and fields.get("Name") == name) or (ids and job in ids):
            ends.append(datetime.fromisoformat(fields["EndTime"]).timestamp())
    return round(max(ends) - t0) if ends else None


def plain_sbatch(name: str, folder: Path, tool: str) -> dict[str, Any]:
    """The sbatch loop (one sbatch a job) or the plain array (one sbatch of TASKS elements)."""
    loop = tool == "sbatch_loop"
    output = f"--output={folder}/sbatch-%j.out" if loop else f"--output={folder}/array-%A_%a.out"
    argv = as_account("sbatch", "--parsable", f"--job-name={name}", *RESOURCES, output)
    argv += ["--wrap", "true"] if loop else [f"--array=0-{TASKS - 1}", "--wrap", "true"]
    t0 = time.perf_counter()
    for _ in range(TASKS if loop else 1):
        done = subprocess.run(argv, capture_output=True, text=True, cwd=folder, check=False)
        if done.returncode != 0:
            raise SystemExit(f"sbatch failed: {done.stderr.strip()}")
    accepted = time.perf_counter() - t0
    say(f"  {TASKS} jobs accepted after {accepted:.2f} s; waiting for squeue to list none")
    until(lambda: queued(name) == 0, tool)
    return {"accepted_s": accepted, "done_s": time.perf_counter() - t0}


def peer(tool: str, name: str, folder: Path) -> dict[str, Any]:
    script = str(ROOT / "bench" / "_peer_tools.py")
    argv = as_account(str(PEER_PY), script, tool, str(TASKS), name, str(folder))
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, cwd=folder, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{tool} failed (exit {done.returncode}); its output is above")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    if result["failed"]:
        raise SystemExit(f"{tool}: {len(result['failed'])} jobs failed: {result['failed'][:5]}")
    return result


def run_peers(folder: Path, offset: int) -> dict[str, dict[str, Any]]:
    results = {}
    for tool in (t for t in PEERS if t in TOOLS):
        name = f"kqpeers-{os.getpid()}-{tool}"
        say(f"{tool}: {TASKS} jobs named {name}")
        t0 = time.time()
        try:
            if tool in ("sbatch_loop", "sbatch_array"):
                found = plain_sbatch(name, folder, tool)
            else:
                found = peer(tool, name, folder)
        finally:
            cancel(name=name)
            drain(tool, name)
        found["slurm_last_end_s"] = slurm_ends(offset, t0, name, None)
        results[tool] = found
        say(f"{tool}: accepted {found['accepted_s']:.2f} s, done {found['done_s']:.2f} s")
    return results


def klique_estate(job_root: Path) -> str:
    # max_queued: Klique's default keeps 100 jobs pending in Slurm and the rest in its own queue;
    # the peers put all N into Slurm at once, so Klique is allowed to as well.
    return slurm_estate(job_root, ACCOUNT, max_queued=TASKS * 2)


def klique_one_by_one(api: httpx.Client) -> dict[str, Any]:
    body = {"command": ["true"], "name": "peers-one"}
    t0 = time.perf_counter()
    for _ in range(TASKS):
        answer = api.post("/tasks", json=body)
        if answer.status_code != 201:
            raise SystemExit(f"POST /tasks: {answer.status_code} {answer.text}")
    say(f"  {TASKS} POST /tasks in {time.perf_counter() - t0:.2f} s")

    def left(states: str) -> bool:
        return bool(api.get("/tasks", params={"state": states, "limit": 1}).json())

    until(lambda: not left(NOT_YET), "Klique: every task accepted", ACCEPTED_POLL_S)
    accepted = time.perf_counter() - t0
    say(f"  every task has a Slurm job after {accepted:.2f} s; waiting for the ends")
    until(lambda: not left(NOT_FINAL), "Klique: every task ended")
    return {"accepted_s": accepted, "done_s": time.perf_counter() - t0}


def klique_sweep(api: httpx.Client) -> dict[str, Any]:
    item = {"command": ["true"], "name": "peers-sweep"}
    tasks = [dict(item, parameters={"i": i}) for i in range(TASKS)]
    t0 = time.perf_counter()
    made = api.post("/sweeps", json={"name": "peers", "tasks": tasks})
    if made.status_code != 201:
        raise SystemExit(f"POST /sweeps: {made.status_code} {made.text}")
    sweep = made.json()["sweep"]
    say(f"  sweep {sweep}: POST /sweeps in {time.perf_counter() - t0:.2f} s")

    def states() -> set[str]:
        return set(api.get(f"/sweeps/{sweep}").json()["states"])

    accepted_yet = set(NOT_YET.split(","))
    until(lambda: not states() & accepted_yet, "Klique sweep: every task accepted", ACCEPTED_POLL_S)
    accepted = time.perf_counter() - t0
    say(f"  every task has a Slurm job after {accepted:.2f} s; waiting for the ends")
    until(lambda: states() <= FINAL, "Klique sweep: every task ended")
    return {"accepted_s": accepted, "done_s": time.perf_counter() - t0}


def native_ids(api: httpx.Client) -> list[str]:
    """Every Slurm job id the API lists, a page at a time."""
    found: list[str] = []
    page: list[dict[str, Any]] = [{"id": None}]
    while page:
        params = {"limit": 1000} | ({"before": page[-1]["id"]} if page[-1]["id"] else {})
        answer = api.get("/tasks", params=params)
        answer.raise_for_status()
        page = answer.json()
        found += [row["native_id"] for row in page if row["native_id"]]
    return found


def klique_jobs(job_root: Path) -> list[str]:
    """alice's jobs pending, running or completing whose output goes under the job root: the
    Klique server's, found without asking it (it may have failed)."""
    argv = ["squeue", "--noheader", f"--user={ACCOUNT}", "--states=PD,R,CG"]
    done = subprocess.run(
        [*argv, "--Format=JobID:30,STDOUT:4000"], capture_output=True, text=True, check=False
    )
    rows = (line.split() for line in done.stdout.splitlines())
    return [row[0] for row in rows if len(row) == 2 and row[1].startswith(f"{job_root}/")]


def run_klique(job_root: Path, offset: int) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    try:
        with klique_server(klique_estate(job_root)) as (api, home):
            try:
                seen: set[str] = set()
                for tool, run in zip(KLIQUE, (klique_one_by_one, klique_sweep), strict=True):
                    if tool not in TOOLS:
                        continue
                    say(f"{tool}: {TASKS} tasks")
                    t0 = time.time()
                    found = run(api)
                    until(lambda: not klique_jobs(job_root), f"{tool}'s jobs leaving the queue")
                    ids = set(native_ids(api)) - seen
                    found["slurm_last_end_s"] = slurm_ends(offset, t0, None, ids)
                    seen |= ids
                    results[tool] = found
                    done = found["done_s"]
                    say(f"{tool}: accepted {found['accepted_s']:.2f} s, done {done:.2f} s")
            finally:
                shutil.copy(home / "server.log", job_root.parent / f"{job_root.name}-server.log")
    finally:
        cancel(ids=klique_jobs(job_root))
    return results


def table(results: dict[str, dict[str, Any]]) -> None:
    print(f"\n{'tool':<20} {'accepted_s':>10} {'done_s':>8} {'slurm_last_end_s':>17}")
    for tool, found in results.items():
        end = found.get("slurm_last_end_s")
        print(f"{tool:<20} {found['accepted_s']:>10.2f} {found['done_s']:>8.2f} {end!s:>17}")
    print()


def one_round(tag: str) -> dict[str, dict[str, Any]]:
    folder = WORK / f"peers-{tag}"
    folder.mkdir()
    shutil.chown(folder, ACCOUNT, ACCOUNT)  # submitit's and PSI/J's folders are alice's
    job_root = WORK / f"peers-{tag}-klique"
    job_root.mkdir(mode=0o1777)
    os.chmod(job_root, 0o1777)
    offset = JOBCOMP.stat().st_size
    say(f"{TASKS} tasks a tool; load average {os.getloadavg()[0]:.2f}")
    try:
        results = run_peers(folder, offset) | run_klique(job_root, offset)
    except httpx.HTTPError as exc:
        raise SystemExit(f"the Klique server failed: {exc}") from exc
    finally:
        subprocess.run(["rm", "-rf", str(folder), str(job_root)], check=False)
    say(f"load average {os.getloadavg()[0]:.2f}; Klique's server log: {job_root}-server.log")
    table(results)
    return results


def main() -> None:
    if set(TOOLS) & {"submitit_loop", "submitit_map_array", "psij"}:
        peers_venv()
    rounds = [one_round(f"{os.getpid()}-{n}") for n in range(1, ROUNDS + 1)]
    results = {
        tool: {
            key: statistics.median(r[tool][key] for r in rounds) for key in ("accepted_s", "done_s")
        }
        for tool in TOOLS
    }
    for tool in TOOLS:
        ends = [r[tool].get("slurm_last_end_s") for r in rounds]
        results[tool]["slurm_last_end_s"] = None if None in ends else statistics.median(ends)
    if ROUNDS > 1:
        say(f"the medians of {ROUNDS} rounds:")
        table(results)
    summary: dict[str, Any] = {
        tool: {key: round(results[tool][key], 2) for key in ("accepted_s", "done_s")}
        for tool in TOOLS
    }
    if ROUNDS > 1:
        for tool in TOOLS:
            summary[tool]["done_s_each"] = [round(r[tool]["done_s"], 2) for r in rounds]
    summary["tasks"] = TASKS
    summary["rounds"] = ROUNDS
    peers = [results[tool] for tool in PEERS if tool in TOOLS and tool != "sbatch_array"]
    if peers and "klique_sweep" in TOOLS:
        sweep = results["klique_sweep"]
        best_done = min(peer["done_s"] for peer in peers)
        best_accepted = min(peer["accepted_s"] for peer in peers)
        summary["klique_sweep_done_ratio"] = round(best_done / sweep["done_s"], 2)
        summary["klique_sweep_accepted_ratio"] = round(best_accepted / sweep["accepted_s"], 2)
        if "sbatch_array" in results:
            array_done = results["sbatch_array"]["done_s"]
            summary["klique_sweep_to_array_ratio"] = round(array_done / sweep["done_s"], 2)
    last_line(summary)


if __name__ == "__main__":
    main()
