"""Where the CPU goes when N trivial tasks run on the real Slurm cluster: the machine's CPU time
(all processes, /proc/stat) per task, for a plain `sbatch` loop of `true` jobs (the baseline)
and for one Klique sweep of `true` tasks (one job array), each from its first submission until
the tool sees every job ended; for the sweep, the shares of the Klique server (its own and its
reaped children's: runuser, sbatch, squeue, file reads), slurmctld and slurmd (its reaped
children: the slurmstepds). On two cores, what the jobs of a sweep cost is what keeps its
`done_s` behind the loop's (peers_slurm.py).

Usage: bench/sweep_cpu.py [N]   (default 500, as peers_slurm.py)

Last line: ms of CPU per task for each, the sweep's shares, and `sweep_to_loop`.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import peers_slurm as peers
from _common import cpu_seconds, klique_server, last_line

TICK = os.sysconf("SC_CLK_TCK")


def machine_s() -> float:
    """CPU time the whole machine has spent busy (every state but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / TICK


def process_s(pid: int) -> tuple[float, float]:
    """A process's own CPU time, and its reaped children's."""
    return cpu_seconds(pid), cpu_seconds(pid, children=True)


def pid_of(name: str) -> int:
    """The daemon of the cluster under test (KLIQUE_SLURM_DIR), by its pid file."""
    return int((peers.WORK.parent / "run" / f"{name}.pid").read_text().split()[0])


def per_task_ms(seconds: float) -> float:
    return round(seconds / peers.TASKS * 1000, 1)


def loop_cpu(folder: Path) -> float:
    name = f"kqcpu-{os.getpid()}-loop"
    before = machine_s()
    try:
        peers.plain_sbatch(name, folder, "sbatch_loop")
    finally:
        peers.cancel(name=name)
    return per_task_ms(machine_s() - before)


def sweep_cpu(job_root: Path) -> dict[str, float]:
    daemons = {"slurmctld": pid_of("slurmctld"), "slurmd": pid_of("slurmd")}
    with klique_server(peers.klique_estate(job_root)) as (api, home):
        processes = {"server": int((home / "bench-server.pid").read_text()), **daemons}
        time.sleep(3)  # past the server's start-up work
        machine, own = machine_s(), {n: process_s(p) for n, p in processes.items()}
        try:
            peers.klique_sweep(api)
        finally:
            peers.cancel(ids=peers.klique_jobs(job_root))
        used = {n: process_s(p) for n, p in processes.items()}
        found = {"sweep_ms": per_task_ms(machine_s() - machine)}
    for name in processes:
        found[f"{name}_ms"] = per_task_ms(used[name][0] - own[name][0])
        found[f"{name}_children_ms"] = per_task_ms(used[name][1] - own[name][1])
    return found


def main() -> None:
    folder = peers.WORK / f"sweep-cpu-{os.getpid()}"
    folder.mkdir()
    folder.chmod(0o1777)
    job_root = peers.WORK / f"sweep-cpu-{os.getpid()}-klique"
    job_root.mkdir(mode=0o1777)
    job_root.chmod(0o1777)
    peers.say(f"{peers.TASKS} tasks each; load average {os.getloadavg()[0]:.2f}")
    try:
        loop = loop_cpu(folder)
        peers.say(f"sbatch loop: {loop} ms of CPU a job")
        sweep = sweep_cpu(job_root)
    finally:
        subprocess.run(["rm", "-rf", str(folder), str(job_root)], check=False)
    peers.say(f"Klique sweep: {sweep['sweep_ms']} ms of CPU a task; of it {sweep}")
    last_line(
        {
            "tasks": peers.TASKS,
            "loop_ms": loop,
            **sweep,
            "sweep_to_loop": round(sweep["sweep_ms"] / loop, 2),
        }
    )


if __name__ == "__main__":
    main()
