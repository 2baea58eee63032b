"""A sweep's tasks on a PBS Professional pool go as one job array (qsub -J), and each subjob is
followed, cancelled and rerun (qrerun) as its own task, on the simulator at the vendor's default
settings (no job history: a finished array leaves the server) and with job history kept. On a
Torque pool the same sweep goes as one array of Torque's (qsub -t), each subjob followed and
cancelled as its own task."""

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
    run_as,
    search_path,
    shared_folder,
)
from helpers.sweep import (
    FINAL,
    control_over,
    ended_as,
    queue_sweep,
    run_with,
    runs_of,
    runs_twice,
    until,
)

from broker.domain import TaskState
from broker.pools.pbs import PbsDriver
from broker.pools.pbs_parse import qstat_text_jobs

TASKS = 30
FAILS, CANCELLED, REQUEUED = 1, TASKS // 2, TASKS - 1  # places in the sweep
HISTORY = {"KLIQUE_SIM_JOB_HISTORY_ENABLE": "true"}


@pytest.fixture
def folder(test_users: Any) -> Iterator[Path]:
    folder = shared_folder("klique-pbs-arrays-")
    try:
        yield folder
    finally:
        remove_tree(folder)


def qstat(path: str, *argv: str) -> tuple[int, dict[str, Any], str]:
    """qstat -f -F json as alice: its exit status, its jobs by id and its standard error."""
    done = run_as("alice", ["qstat", *argv, "-f", "-F", "json"], path)
    return done.returncode, json.loads(done.stdout or "{}").get("Jobs", {}), done.stderr


def torque_qstat(path: str, *argv: str) -> tuple[int, dict[str, dict[str, str]], str]:
    """Torque's qstat -f -1 as alice: its exit status, its jobs by id and its standard error."""
    done = run_as("alice", ["qstat", *argv, "-f", "-1"], path)
    return done.returncode, dict(qstat_text_jobs(done.stdout)), done.stderr


def requeued(event: dict[str, Any]) -> bool:
    """The event of the rerun subjob's way back to pending (not a wait for a slot before its
    first run)."""
    return event["to"] == "pending" and event["reason"].startswith("requeued by pbs (restart 1)")


@pytest.mark.parametrize("server", [{}, HISTORY], ids=["default", "job-history"])
def test_a_sweep_runs_as_one_pbs_job_array_with_each_subjob_its_own_task(
    folder: Path, server: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job_root = open_folder(folder / "jobs")
    path = search_path(login_node(folder, "pbspro", open_folder(folder / "sim"), settings=server))
    monkeypatch.setenv("PATH", path)  # the local transport passes it to the pool's accounts
    store, driver, control = control_over("pbspro", job_root, folder, PbsDriver)
    record, go = job_root / "runs", job_root / "go"  # the rerun task's runs, and its end
    commands = {
        FAILS: ("sh", "-c", "exit 3"),
        CANCELLED: ("sleep", "600"),
        REQUEUED: runs_twice(record, go),
    }
    ids = queue_sweep(store, TASKS, commands, "arrays")
    seen_running: dict[str, Any] = {}

    async def steps(running: asyncio.Task[None]) -> None:
        await until(lambda: all(store.get(i).native_id for i in ids), "every submission", running)
        long_task = lambda: store.get(ids[CANCELLED]).state is TaskState.RUNNING  # noqa: E731
        await until(long_task, "the long task's start", running)
        # While the array is there, qstat -t lists its subjobs, the long one running.
        array = str(store.get(ids[0]).native_id).replace("[0]", "[]")
        _, seen, _ = await asyncio.to_thread(qstat, path, "-t", array)
        seen_running.update(seen)
        await control.cancel(store.get(ids[CANCELLED]))
        # Rerun (as root, a PBS manager) once its first run has begun its command and the
        # pool has listed it running with its run_count (a whole look since: the runner's own
        # report may have shown it running first); qrerun answers once the subjob is queued
        # again.
        seen_run = lambda: store.get(ids[REQUEUED]).state is TaskState.RUNNING  # noqa: E731
        first_run = lambda: runs_of(record) == 1 and seen_run()  # noqa: E731
        await until(first_run, "the first run of the task to be rerun", running)
        agent = control.agents["batch"]
        looked = agent.looks + 2
        await until(lambda: agent.looks >= looked, "a look at the first run", running)
        argv = ["qrerun", str(store.get(ids[REQUEUED]).native_id)]
        done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True)
        assert (done.returncode, done.stderr) == (0, ""), done
        # The subjob runs again at once (run_count 2): Klique sees it requeued while it runs.
        back = lambda: any(requeued(e) for e in store.events(ids[REQUEUED]))  # noqa: E731
        await until(back, "the rerun task's way back to pending", running)
        go.touch()
        ended = lambda: all(store.get(i).state in FINAL for i in ids)  # noqa: E731
        await until(ended, "the end of every task", running)

    run_with(control, driver, steps)
    tasks = ended_as(store, ids, {FAILS: TaskState.FAILED, CANCELLED: TaskState.CANCELLED})
    assert tasks[FAILS].exit_code == 3

    # The rerun subjob ran again under the same id (run_count 2); Klique saw it go back to
    # pending, and its second run's exit file decided.
    assert runs_of(record) == 2
    assert [e for e in store.events(ids[REQUEUED]) if requeued(e)], store.events(ids[REQUEUED])
    assert tasks[REQUEUED].exit_code == 0

    # One array job (qsub printed N[].server), each subjob one task's, in the sweep's order.
    number, _, server_name = str(tasks[0].native_id).partition("[0]")
    array = f"{number}[]{server_name}"
    assert [t.native_id for t in tasks] == [f"{number}[{n}]{server_name}" for n in range(TASKS)]
    assert seen_running[array]["job_state"] == "B"
    assert seen_running[array]["array_indices_submitted"] == f"0-{TASKS - 1}"
    subjobs = {k: v for k, v in seen_running.items() if k != array}
    assert set(subjobs) == {t.native_id for t in tasks}
    assert subjobs[str(tasks[CANCELLED].native_id)]["job_state"] == "R"
    assert {v["Job_Name"] for v in seen_running.values()} == {seen_running[array]["Job_Name"]}

    # Afterwards: kept with job history, each subjob with its own exit status; gone without.
    status, after, error = qstat(path, "-x", "-t", array)
    if server:
        assert after[array]["job_state"] == "F"
        assert after[str(tasks[FAILS].native_id)]["Exit_status"] == 3
        assert after[str(tasks[CANCELLED].native_id)]["substate"] == 91  # deleted
        assert {after[str(t.native_id)]["job_state"] for t in tasks} == {"X"}
    else:
        assert "PBS is not configured to maintain job history" in error
        status, after, error = qstat(path, "-t", array)
        assert (status, after) == (153, {}) and f"Unknown Job Id {array}" in error
    # The simulator's job table: that array's subjobs, one per task, and no other job.
    table = json.loads((folder / "sim" / "pbspro" / "state.json").read_text())["jobs"].values()
    shown = sorted((j["array"]["id"], j["array"]["index"]) for j in table if j.get("array"))
    assert shown == [(int(number), n) for n in range(TASKS)]
    assert len(table) == TASKS
    store.close()


def test_a_sweep_runs_as_one_torque_job_array_with_each_subjob_its_own_task(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Torque (qsub -t): one array N[].server, each task its subjob N[i].server in the sweep's
    order, followed through qstat -t; one subjob fails, one is cancelled (qdel N[i]), the rest
    complete. Torque names each subjob `<array's name>-<index>` (TORQUE job_clone)."""
    job_root = open_folder(folder / "jobs")
    path = search_path(login_node(folder, "torque", open_folder(folder / "sim")))
    monkeypatch.setenv("PATH", path)  # the local transport passes it to the pool's accounts
    store, driver, control = control_over("torque", job_root, folder, PbsDriver)
    commands = {FAILS: ("sh", "-c", "exit 3"), CANCELLED: ("sleep", "600")}
    ids = queue_sweep(store, TASKS, commands, "arrays")
    seen: dict[str, dict[str, dict[str, str]]] = {}

    async def steps(running: asyncio.Task[None]) -> None:
        await until(lambda: all(store.get(i).native_id for i in ids), "every submission", running)
        long_task = lambda: store.get(ids[CANCELLED]).state is TaskState.RUNNING  # noqa: E731
        await until(long_task, "the long task's start", running)
        # While it runs: qstat -t lists each subjob; without -t, one summary for the array.
        array = str(store.get(ids[0]).native_id).replace("[0]", "[]")
        seen["subjobs"] = (await asyncio.to_thread(torque_qstat, path, "-t", array))[1]
        seen["summary"] = (await asyncio.to_thread(torque_qstat, path, array))[1]
        await control.cancel(store.get(ids[CANCELLED]))
        ended = lambda: all(store.get(i).state in FINAL for i in ids)  # noqa: E731
        await until(ended, "the end of every task", running)

    run_with(control, driver, steps)
    tasks = ended_as(store, ids, {FAILS: TaskState.FAILED, CANCELLED: TaskState.CANCELLED})
    assert tasks[FAILS].exit_code == 3
    assert {t.exit_code for n, t in enumerate(tasks) if n not in (FAILS, CANCELLED)} == {0}

    # One array job (qsub printed N[].server), each subjob one task's, in the sweep's order.
    number, _, server_name = str(tasks[0].native_id).partition("[0]")
    array = f"{number}[]{server_name}"
    assert [t.native_id for t in tasks] == [f"{number}[{n}]{server_name}" for n in range(TASKS)]
    assert set(seen["subjobs"]) == {t.native_id for t in tasks}
    cancelled = seen["subjobs"][str(tasks[CANCELLED].native_id)]
    assert cancelled["job_state"] == "R" and cancelled["job_array_id"] == str(CANCELLED)
    [(summary_id, summary)] = seen["summary"].items()
    assert summary_id == array and summary["job_array_request"] == f"0-{TASKS - 1}"
    assert {v["Job_Name"] for v in seen["subjobs"].values()} == {
        f"{summary['Job_Name']}-{n}" for n in range(TASKS)
    }

    # Afterwards: each subjob completed (C) with its own exit status, for keep_completed.
    _, after, _ = torque_qstat(path, "-t", array)
    assert {v["job_state"] for v in after.values()} == {"C"}
    assert after[str(tasks[FAILS].native_id)]["exit_status"] == "3"
    assert after[str(tasks[CANCELLED].native_id)]["exit_status"] in ("143", "271")  # SIGTERM
    # The simulator's job table: that array's subjobs, one per task, and no other job.
    table = json.loads((folder / "sim" / "torque" / "state.json").read_text())["jobs"].values()
    shown = sorted((j["array"]["id"], j["array"]["index"]) for j in table if j.get("array"))
    assert shown == [(int(number), n) for n in range(TASKS)]
    assert len(table) == TASKS
    store.close()
