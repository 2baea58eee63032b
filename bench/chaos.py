"""The chaos scenarios of tests/chaos on the real Slurm cluster (scripts/services-up): one line
per scenario, then, last, one JSON object with the totals:
{"faults": ..., "tasks": ..., "duplicates": 0, "lost": 0, "wrong_final": 0}.
Exits non-zero when a scenario found a problem (a duplicate, a lost task, a wrong final state,
or a check of its own) or could not run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "chaos"), str(ROOT)]

from agent_scenarios import agent_crashes, control_plane_crashes, network_cut  # noqa: E402
from chaos_scenarios import (  # noqa: E402
    Outcome,
    controller_outage,
    crash_and_restart,
    foreign_tag,
    fresh_postgres_schema,
    hard_kills,
    lost_submit_replies,
    short_min_job_age,
    ssh_drops,
    store_crash,
)
from sim_scenarios import sim_lost_replies  # noqa: E402

TOTALS = ("faults", "tasks", "duplicates", "lost", "wrong_final")


def _postgres(workdir: Path) -> Outcome:
    done = subprocess.run(
        [str(ROOT / "scripts" / "pg-up")], capture_output=True, text=True, check=True
    )
    url, drop = fresh_postgres_schema(done.stdout.strip().splitlines()[-1])
    try:
        return store_crash(url, "postgresql")
    finally:
        drop()


SCENARIOS: list[tuple[str, Callable[[Path], Outcome]]] = [
    ("crash-restart", crash_and_restart),
    ("foreign-tag", foreign_tag),
    ("controller-outage", controller_outage),
    ("lost-submit-replies", lost_submit_replies),
    ("lost-submit-replies-pbspro", lambda _w: sim_lost_replies("pbspro")),
    ("lost-submit-replies-torque", lambda _w: sim_lost_replies("torque")),
    ("lost-submit-replies-lsf", lambda _w: sim_lost_replies("lsf")),
    ("ssh-drops", ssh_drops),
    ("remote-agent-kills", agent_crashes),
    ("control-plane-kills-under-agent", control_plane_crashes),
    ("agent-network-cut-60s", network_cut),
    ("hard-kill", hard_kills),
    ("min-job-age-2", short_min_job_age),
    ("store-crash-sqlite", lambda w: store_crash(f"sqlite:///{w / 'klique.db'}", "sqlite")),
    ("store-crash-postgresql", _postgres),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [name for name, _ in SCENARIOS]
    parser.add_argument(
        "--only", action="append", choices=names, metavar="SCENARIO",
        help=f"run only this scenario (repeatable; default all): {', '.join(names)}",
    )  # fmt: skip
    chosen = set(parser.parse_args().only or names)
    subprocess.run([str(ROOT / "scripts" / "services-up")], check=True, capture_output=True)
    totals = dict.fromkeys(TOTALS, 0)
    unclean = 0
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="klique-chaos-"))
    for name, scenario in SCENARIOS:
        if name not in chosen:
            continue
        workdir = scratch / name
        workdir.mkdir()
        try:
            outcome = scenario(workdir)
        except Exception as exc:  # a scenario that could not run is reported, not hidden
            unclean += 1
            print(f"{name}: could not run: {exc}", flush=True)
            continue
        unclean += not outcome.clean
        print(outcome.line(), flush=True)
        for key in TOTALS:
            totals[key] += getattr(outcome, key)
    if unclean:
        print(f"servers' logs and stores kept in {scratch}", flush=True)
    else:
        shutil.rmtree(scratch)
    print(f"all scenarios: {time.monotonic() - started:.0f} s", flush=True)
    print(json.dumps(totals), flush=True)
    return 1 if unclean else 0


if __name__ == "__main__":
    sys.exit(main())
