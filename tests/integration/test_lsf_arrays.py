"""A sweep's tasks on one LSF pool go as one job array (bsub -J "name[1-N]"), and each element
is followed, cancelled and requeued (brequeue) as its own task, on the LSF simulator: its bjobs
is the judge."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.batch import (
    login_node,
    open_folder,
    remove_tree,
    search_path,
    shared_folder,
)
from helpers.sweep import (
    FINAL,
    LSF_MINUTE,
    control_over,
    ended_as,
    queue_sweep,
    run_with,
    runs_of,
    runs_twice,
    until,
)

from broker.domain import TaskState
from broker.pools.arrays import array_folder_named
from broker.pools.lsf import LsfDriver

TASKS = 30
FAILS, CANCELLED, REQUEUED = 2, 17, TASKS - 1  # places in the sweep


@pytest.fixture
def site(test_users: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """The LSF simulator's commands first on PATH (the driver's transport passes it on to the
    accounts), and a job root every account may write."""
    folder = shared_folder("klique-lsf-arrays-")
    try:
        sim = open_folder(folder / "sim")
        path = search_path(login_node(folder, "lsf", sim, settings=LSF_MINUTE))
        monkeypatch.setenv("PATH", path)
        yield folder, open_folder(folder / "jobs")
    finally:
        remove_tree(folder)


def bjobs(*args: str) -> list[dict[str, str]]:
    """bjobs -json records, as the LSF administrator sees them (every user's jobs)."""
    argv = ["bjobs", "-a", "-u", "all", "-o", "jobid jobindex stat job_name exit_reason"]
    done = subprocess.run([*argv, "-json", *args], capture_output=True, text=True, check=True)
    return list(json.loads(done.stdout)["RECORDS"])


def test_a_sweep_runs_as_one_lsf_job_array_with_each_element_its_own_task(
    tmp_path: Path, site: tuple[Path, Path]
) -> None:
    _folder, job_root = site
    store, driver, control = control_over("lsf", job_root, tmp_path, LsfDriver)
    record, go = job_root / "runs", job_root / "go"  # the requeued task's runs, and its end
    commands = {
        FAILS: ("sh", "-c", "exit 3"),
        CANCELLED: ("sleep", "600"),
        REQUEUED: runs_twice(record, go),
    }
    ids = queue_sweep(store, TASKS, commands, "lsf-arrays")
    expected = {FAILS: TaskState.FAILED, CANCELLED: TaskState.CANCELLED}
    running_then: list[TaskState] = []

    async def steps(running: asyncio.Task[None]) -> None:
        long_one = lambda: store.get(ids[CANCELLED]).state is TaskState.RUNNING  # noqa: E731
        await until(long_one, "the long task's start", running)
        await control.cancel(store.get(ids[CANCELLED]))
        # Requeued once its first run has begun its command and Klique has seen it run.
        seen_run = lambda: store.get(ids[REQUEUED]).state is TaskState.RUNNING  # noqa: E731
        await until(lambda: runs_of(record) == 1 and seen_run(), "the first run", running)
        element = str(store.get(ids[REQUEUED]).native_id)
        done = await asyncio.to_thread(
            subprocess.run, ["brequeue", element], capture_output=True, text=True
        )
        assert done.stdout == f"Job <{element}> is being requeued \n", done
        # bjobs shows no count of runs: through the element's second run, and the listings
        # Klique reads meanwhile, the task runs again (the first run's exit file is not its
        # end); a listing that caught it pending again put it back to pending as requeued.
        await until(lambda: runs_of(record) == 2, "the second run", running)
        calls = driver.status_calls
        await until(lambda: driver.status_calls >= calls + 2, "two listings", running)
        running_then.append(store.get(ids[REQUEUED]).state)
        go.touch()
        ended = lambda: all(store.get(i).state in FINAL for i in ids)  # noqa: E731
        await until(ended, "the end of every task", running)

    run_with(control, driver, steps)
    tasks = ended_as(store, ids, expected)
    assert tasks[FAILS].exit_code == 3
    assert running_then == [TaskState.RUNNING] and runs_of(record) == 2
    assert tasks[REQUEUED].exit_code == 0
    # (It may have waited for a slot before its first run; after it, only as requeued.)
    events = store.events(ids[REQUEUED])
    first_run = next(n for n, e in enumerate(events) if e["to"] == "running")
    waits = [e for e in events[first_run:] if e["to"] == "pending"]
    assert all("requeued by lsf" in e["reason"] for e in waits), events

    # One array, its elements 1..N one per task in the sweep's order, each task's own.
    arrays = {str(t.native_id).partition("[")[0] for t in tasks}
    assert len(arrays) == 1, arrays
    [array] = arrays
    assert [t.native_id for t in tasks] == [f"{array}[{n}]" for n in range(1, TASKS + 1)]

    # bjobs lists each element under the array's number, named "<array's name>[index]", and
    # no other job: no task went as a job of its own.
    records = bjobs()
    assert sorted(int(r["JOBINDEX"]) for r in records) == list(range(1, TASKS + 1))
    assert {r["JOBID"] for r in records} == {array}
    name = records[0]["JOB_NAME"].rpartition("[")[0]
    assert all(r["JOB_NAME"] == f"{name}[{r['JOBINDEX']}]" for r in records)
    states = {int(r["JOBINDEX"]): (r["STAT"], r["EXIT_REASON"]) for r in bjobs(array)}
    assert states[FAILS + 1] == ("EXIT", "")
    assert states[CANCELLED + 1] == ("EXIT", "TERM_OWNER: job killed by owner")
    assert {states[n + 1] for n in range(TASKS) if n not in expected} == {("DONE", "")}

    # LSF's report of each element in a file of its own (-o .../lsf-%J.%I.out), in the
    # array's folder; each task's output in its own folder.
    folder = Path(str(array_folder_named(str(job_root), name)))
    for n in range(1, TASKS + 1):
        report = (folder / f"lsf-{array}.{n}.out").read_text()
        assert f"Subject: Job {array}[{n}]: <{name}[{n}]>" in report
    assert all(Path(str(t.job_dir), "exit.json").exists() for t in tasks if t.id != ids[CANCELLED])
    store.close()
