"""Chaos on the PBS Professional, Torque and LSF simulators of tests/fakes: submit replies lost
after the scheduler queued the job (the simulators' `lose-replies` switch,
tests/fakes/README.md), judged by the simulator's own job table."""

from __future__ import annotations

import json
import time
from pathlib import Path

from chaos_scenarios import COMPLETED, FAILED_3, Outcome, Work
from conftest import start_server, stop_server, wait_for
from helpers.batch import login_node, open_folder, remove_tree, search_path, shared_folder
from helpers.sweep import LSF_MINUTE, sweep_estate

from broker.domain import TaskSpec
from broker.store.repository import Store


def sim_lost_replies(scheduler: str, tasks: int = 6, lost: int = 3) -> Outcome:
    """`tasks` tasks on the `scheduler` simulator ("pbspro", "torque", "lsf") whose first
    `lost` submissions are queued and then answered with the communication error the real
    command prints: every task must end as its command says, with one job each in the
    simulator's table, under the id its record names."""
    started = time.monotonic()
    folder = shared_folder(f"klique-lost-replies-{scheduler}-")
    try:
        sim = open_folder(folder / "sim")
        path = search_path(login_node(folder, scheduler, sim, settings=LSF_MINUTE))
        estate = folder / "estate.yaml"
        estate.write_text(sweep_estate(scheduler, open_folder(folder / "jobs")))
        state = open_folder(sim / scheduler)
        switch = state / "lose-replies"
        switch.write_text(str(lost))
        switch.chmod(0o666)  # the pool's accounts run qsub and bsub
        work = [
            Work("alice", ("sh", "-c", "exit 3"), FAILED_3)
            if n % 5 == 4
            else Work("alice", ("true",), COMPLETED)
            for n in range(tasks)
        ]
        outcome = _run(scheduler, folder, path, estate, work)
        taken = lost - int(switch.read_text() or 0)
        outcome.faults = taken
        if taken != lost:
            outcome.problems.append(f"{taken} of {lost} replies were lost")
        _judge(outcome, state, folder / "home", work)
        outcome.seconds = time.monotonic() - started
        return outcome
    finally:
        remove_tree(folder)


def _run(scheduler: str, folder: Path, path: str, estate: Path, work: list[Work]) -> Outcome:
    home = folder / "home"
    home.mkdir()
    store = Store.open(f"sqlite:///{home / 'klique.db'}")
    try:
        for item in work:
            store.create_task(TaskSpec(item.command, "cpu"), item.owner, None)
        server = start_server(home, estate, {"PATH": path})
        outcome = Outcome(f"lost-submit-replies-{scheduler}", 0, len(work))
        try:
            ended = lambda: all(t.state.final for t in store.tasks())  # noqa: E731
            wait_for(ended, 180, "every task to end")
        except AssertionError as exc:
            outcome.problems.append(str(exc))
        finally:
            stop_server(server)
    finally:
        store.close()
    return outcome


def _judge(outcome: Outcome, state: Path, home: Path, work: list[Work]) -> None:
    """Every task against the simulator's own job table (`state.json`)."""
    store = Store.open(f"sqlite:///{home / 'klique.db'}")
    try:
        tasks = sorted(store.tasks(), key=lambda t: t.id)
    finally:
        store.close()
    table = json.loads((state / "state.json").read_text())["jobs"].values()
    jobs: dict[str, list[str]] = {}
    for job in table:
        jobs.setdefault(str(job["name"]), []).append(str(job["id"]))
    for task, item in zip(tasks, work, strict=True):
        found = jobs.pop(task.tag, [])
        if len(found) > 1:
            outcome.duplicates += len(found) - 1
            outcome.problems.append(f"task {task.id} has jobs {found}")
        if not task.state.final or not found:
            outcome.lost += 1
            outcome.problems.append(f"task {task.id} is {task.state.value} with jobs {found}")
        elif (task.state.value, task.exit_code) != (item.expect.state, item.expect.exit_code):
            outcome.wrong_final += 1
            outcome.problems.append(
                f"task {task.id} ended {task.state.value} {task.exit_code} ({task.reason!r})"
            )
        elif task.native_id and task.native_id.split(".")[0] != found[0]:
            # (a job that ended before the look is adopted by its exit file, with no id)
            outcome.wrong_final += 1
            outcome.problems.append(f"task {task.id} records job {task.native_id}, not {found}")
    if jobs:
        outcome.duplicates += sum(len(ids) for ids in jobs.values())
        outcome.problems.append(f"jobs no task owns: {jobs}")
    log = (home / "server.log").read_text(errors="replace")
    if "submission outcome unknown" not in log:
        outcome.problems.append("no submission's outcome was unknown: the fault was missed")
