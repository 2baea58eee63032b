"""A server SIGKILLed between a job array's qsub/bsub and its record, on the PBS Professional,
Torque and LSF simulators: the restarted server finds each task in the array by its dispatcher, and
the simulator's own job table is the judge (one element per task, none submitted twice, none
lost)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, free_port, start_server, stop_server, wait_for
from helpers.batch import (
    login_node,
    open_folder,
    remove_tree,
    search_path,
    shared_folder,
)
from helpers.sweep import LSF_MINUTE, ended_as, queue_sweep, sweep_estate

from broker.domain import TaskState
from broker.store.repository import Store

TASKS = 12
FAILS = 4  # the place in the sweep of the task that exits 3
ELEMENT = re.compile(r"(\d+)\[(\d+)\]")  # PBS 1000[3].server, Torque 2000[3].server, LSF 3000[3]


@pytest.fixture(params=["pbspro", "torque", "lsf"])
def site(request: Any, test_users: Any) -> Iterator[dict[str, Path | str]]:
    scheduler = request.param
    with ExitStack() as stack:
        folder = shared_folder(f"klique-array-crash-{scheduler}-")
        stack.callback(remove_tree, folder)
        sim = open_folder(folder / "sim")
        path = search_path(login_node(folder, scheduler, sim, settings=LSF_MINUTE))
        estate = folder / "estate.yaml"
        estate.write_text(sweep_estate(scheduler, open_folder(folder / "jobs")))
        yield {
            "scheduler": scheduler,
            "folder": folder,
            "sim": sim / scheduler,
            "path": path,
            "estate": estate,
        }


def crashing_server(home: Path, estate: Path, path: str, point: str) -> int:
    """A server on this home that SIGKILLs itself at `point`; its exit status."""
    port = free_port()
    args = [sys.executable, "-m", "broker", "server", "--port", str(port), "--estate", str(estate)]
    args += ["--routes-port", str(free_port())]
    args += ["--public-url", f"http://127.0.0.1:{port}"]  # the simulated nodes are here
    env = {**os.environ, "KLIQUE_HOME": str(home), "PATH": path, "KLIQUE_CRASH_AT": point}
    with (home / "server.log").open("ab") as log:
        process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        return process.wait(120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_server_killed_after_an_arrays_submission_doubles_and_loses_no_element(
    site: dict[str, Any],
) -> None:
    folder: Path = site["folder"]
    runs = open_folder(folder / "runs")  # each task appends a line to its own file, per run
    go = folder / "go"  # the tasks wait for it: none ends before the restarted server looks
    wait = f'while [ ! -e {go} ]; do sleep 0.1; done; echo ran >> "$1"'
    home = folder / "home"
    home.mkdir()
    store = Store.open(f"sqlite:///{home / 'klique.db'}")
    commands = {
        n: ("sh", "-c", wait + ("; exit 3" if n == FAILS else ""), "-", f"{runs}/{n}")
        for n in range(TASKS)
    }
    ids = queue_sweep(store, TASKS, commands, "crash")
    code = crashing_server(home, site["estate"], site["path"], "after_submit:1")
    assert code == -signal.SIGKILL, (home / "server.log").read_text()
    placed = [store.get(i) for i in ids]
    assert {t.state for t in placed} == {TaskState.PLACED}  # queued in the simulator, unrecorded
    assert not any(t.native_id for t in placed)

    server = start_server(home, site["estate"], {"PATH": site["path"]})
    try:
        adopted = lambda: all(store.get(i).native_id for i in ids)  # noqa: E731
        wait_for(adopted, 120, "the restarted server to find every task's element")
        go.touch()
        ended = lambda: all(store.get(i).state.final for i in ids)  # noqa: E731
        wait_for(ended, 120, "every task to end")
    finally:
        stop_server(server)

    tasks = ended_as(store, ids, {FAILS: TaskState.FAILED})
    store.close()
    assert tasks[FAILS].exit_code == 3
    # Each task ran once, as one element of one array, the element its record names.
    assert [Path(runs, str(n)).read_text() for n in range(TASKS)] == ["ran\n"] * TASKS
    elements = [ELEMENT.match(str(t.native_id)) for t in tasks]
    assert all(elements), [t.native_id for t in tasks]
    assert len({e[1] for e in elements if e}) == 1, [t.native_id for t in tasks]
    # The simulator's job table: one array, as many elements as tasks, no other job.
    table = json.loads(Path(site["sim"], "state.json").read_text())["jobs"].values()
    shown = sorted(f"{j['array']['id']}[{j['array']['index']}]" for j in table if j.get("array"))
    assert sorted(e[0] for e in elements if e) == shown
    assert not [j for j in table if not j.get("array") and j.get("launch_time")]
