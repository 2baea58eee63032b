"""What a pool's batch of state changes costs the store: TASKS tasks placed, submitted, running
and completed, each step one batch (`Store.change_states` for a cycle's placements and a
batch's acceptance, `Store.move_each` for a look's observations), against the same rows changed
with plain SQL through sqlite3 in the same run and the same database (for each step, one
transaction: UPDATE of the tasks, INSERT of their events, and the ledger's runs opened or
closed). Best of three runs each.

Last line: {"tasks", "store_s": {step: s}, "sql_s": {step: s}, "ratio"}; the ratio is the
store's total time over plain SQL's (the price of the ORM and of the checks each move makes).
Usage: bench/store_moves.py [TASKS] (default 500).
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from _common import last_line

from broker.domain import TaskSpec, TaskState
from broker.store.repository import Move, Store

TASKS = int(sys.argv[1]) if len(sys.argv) > 1 else 500
RUNS = 3
STEPS = ("placed", "submitted", "running", "completed")


def made(store: Store) -> list[int]:
    items: list[tuple[TaskSpec, float, dict[str, Any]]]
    items = [(TaskSpec(("true",), "cpu"), 1.0, {}) for _ in range(TASKS)]
    _sweep, tasks = store.create_queued(items, "alice", None, "bench")
    return [task.id for task in tasks]


def through_store(store: Store) -> dict[str, float]:
    ids = made(store)
    S = TaskState  # noqa: N806 (short, as the states read in tests)
    steps: dict[str, Callable[[], object]] = {
        "placed": lambda: store.change_states(
            ids, S.PLACED, "", [S.QUEUED], {i: {"pool": "p"} for i in ids}
        ),
        "submitted": lambda: store.change_states(
            ids, S.SUBMITTED, "", [S.PLACED], {i: {"native_id": f"7_{i}"} for i in ids}
        ),
        "running": lambda: store.move_each([Move(i, S.RUNNING, "R") for i in ids]),
        "completed": lambda: store.move_each(
            [Move(i, S.COMPLETED, "done", fields={"exit_code": 0}) for i in ids]
        ),
    }
    return {name: timed(step) for name, step in steps.items()}


def through_sql(path: str, store: Store) -> dict[str, float]:
    ids = made(store)
    db = sqlite3.connect(path, isolation_level=None)

    def change(old: str, new: str, extra: str, each: Callable[[int], tuple[object, ...]]) -> None:
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            f"UPDATE tasks SET state = ?, reason = '', updated_at = ?{extra} "
            "WHERE id = ? AND state = ?",
            [(new, now, *each(i), i, old) for i in ids],
        )
        db.executemany(
            "INSERT INTO task_events (task_id, time, old_state, new_state, reason) "
            "VALUES (?, ?, ?, ?, '')",
            [(i, now, old, new) for i in ids],
        )
        if new == "running":
            db.executemany(
                "INSERT INTO ledger (task_id, owner, team, project, resource, pool, gpus, start, "
                "gpu_seconds) SELECT id, owner, team, project, resource, pool, gpus, ?, 0 "
                "FROM tasks WHERE id = ?",
                [(now, i) for i in ids],
            )
        if old == "running":
            db.executemany(
                "UPDATE ledger SET end = ?, gpu_seconds = gpus * (? - start) "
                "WHERE task_id = ? AND end IS NULL",
                [(now, now, i) for i in ids],
            )
        db.execute("COMMIT")

    steps: dict[str, Callable[[], object]] = {
        "placed": lambda: change("queued", "placed", ", pool = ?", lambda i: ("p",)),
        "submitted": lambda: change(
            "placed", "submitted", ", native_id = ?, submitted_at = ?", lambda i: (f"7_{i}", 0)
        ),
        "running": lambda: change("submitted", "running", ", started_at = ?", lambda i: (0,)),
        "completed": lambda: change(
            "running", "completed", ", exit_code = 0, finished_at = ?", lambda i: (0,)
        ),
    }
    found = {name: timed(step) for name, step in steps.items()}
    db.close()
    return found


def timed(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def main() -> None:
    store_s: dict[str, list[float]] = {name: [] for name in STEPS}
    sql_s: dict[str, list[float]] = {name: [] for name in STEPS}
    with tempfile.TemporaryDirectory(prefix="klique-bench-store-") as folder:
        path = f"{folder}/klique.db"
        store = Store.open(f"sqlite:///{path}")
        for _ in range(RUNS):  # interleaved, so that a change of load hits both alike
            for name, seconds in through_store(store).items():
                store_s[name].append(seconds)
            for name, seconds in through_sql(path, store).items():
                sql_s[name].append(seconds)
        store.close()
    best = {name: round(min(values), 3) for name, values in store_s.items()}
    plain = {name: round(min(values), 3) for name, values in sql_s.items()}
    print(f"{'step':<10} {'store_s':>8} {'sql_s':>8}   ({TASKS} tasks, best of {RUNS})")
    for name in STEPS:
        print(f"{name:<10} {best[name]:>8.3f} {plain[name]:>8.3f}")
    ratio = round(sum(best.values()) / sum(plain.values()), 2)
    last_line({"tasks": TASKS, "store_s": best, "sql_s": plain, "ratio": ratio})


if __name__ == "__main__":
    main()
