"""Failover on the real Slurm cluster (scripts/services-up): two replicas of the server on one
PostgreSQL behind nginx, a storm of creates through nginx, and the leader struck at random
moments, by turns SIGKILLed and cut from the database (tests/chaos/failover_scenarios.py).
Prints one line per takeover, the accounting against Slurm's records, and, last, one JSON
object: the time until the other replica led (median and worst, and as a ratio of the lease's
time, the bound measured against), and the duplicates, lost and wrong final states (all 0).

    python bench/failover.py [--tasks 200] [--faults 6] [--ttl 8] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "chaos"), str(ROOT)]

from chaos_scenarios import fresh_postgres_schema  # noqa: E402
from failover_scenarios import failover  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200, help="tasks in the storm")
    parser.add_argument("--faults", type=int, default=6, help="faults, kills and cuts by turns")
    parser.add_argument("--ttl", type=float, default=8.0, help="the lease's time, seconds")
    parser.add_argument("--per-s", type=float, default=4.0, help="creates a second")
    parser.add_argument("--seed", type=int, default=None, help="the random moments' seed")
    args = parser.parse_args()
    subprocess.run([str(ROOT / "scripts" / "services-up")], check=True, capture_output=True)
    pg = subprocess.run(
        [str(ROOT / "scripts" / "pg-up")], capture_output=True, text=True, check=True
    )
    url, drop = fresh_postgres_schema(pg.stdout.strip().splitlines()[-1])
    scratch = Path(tempfile.mkdtemp(prefix="klique-failover-"))
    faults = tuple("kill" if i % 2 == 0 else "cut" for i in range(args.faults))
    try:
        result = failover(
            scratch, url, args.tasks, faults, ttl_s=args.ttl, per_s=args.per_s, seed=args.seed
        )
    finally:
        drop()
    outcome = result.outcome
    for number, takeover in enumerate(result.takeovers, 1):
        stopped = ""
        if takeover.stopped_before_s is not None:
            stopped = f"; the cut leader stopped {takeover.stopped_before_s:.2f} s before"
        elif takeover.old_stopped_first is False:
            stopped = "; THE CUT LEADER HAD NOT STOPPED"
        print(
            f"fault {number}: {takeover.fault}: the other led after {takeover.seconds:.1f} s"
            f"{stopped}",
            flush=True,
        )
    print(outcome.line(), flush=True)
    seconds = [t.seconds for t in result.takeovers]
    if outcome.clean:
        shutil.rmtree(scratch)
    else:
        print(outcome.explain(), flush=True)
        print(f"logs and nginx kept in {scratch}", flush=True)
    median = statistics.median(seconds)
    margins = [t.stopped_before_s for t in result.takeovers if t.stopped_before_s is not None]
    ahead = round(min(margins), 2) if margins else None  # how long before the other led, least
    print(
        json.dumps(
            {
                "tasks": outcome.tasks,
                "kills": faults.count("kill"),
                "cuts": faults.count("cut"),
                "ttl_s": args.ttl,
                "takeover_median_s": round(median, 2),
                "takeover_max_s": round(max(seconds), 2),
                "takeover_max_ratio_to_ttl": round(max(seconds) / args.ttl, 2),
                "duplicates": outcome.duplicates,
                "lost": outcome.lost,
                "wrong_final": outcome.wrong_final,
                "cut_leader_stopped_before_min_s": ahead,
                "seconds": round(outcome.seconds),
            }
        ),
        flush=True,
    )
    return 0 if outcome.clean else 1


if __name__ == "__main__":
    sys.exit(main())
