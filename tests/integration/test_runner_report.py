"""HTTP reports reach a stdlib server on loopback; an unreachable API never fails the task."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from conftest import wait_for
from helpers.runner import (
    ReportSink,
    console,
    make_job,
    read_json,
    run_runner,
    start_runner,
)

TASK = (
    "from inside_job import report\n"
    "for i in range(3):\n"
    "    print('line', i)\n"
    "    report.scalar('loss', 1.0 / (i + 1), step=i)\n"
    "print('caf\\u00e9 done')\n"
)


ORDER = ["setting_up", "running", "done"]


def test_states_console_scalars_and_exit_arrive(tmp_path):
    sink = ReportSink()
    try:
        job = make_job(
            tmp_path,
            id=42,
            command=[sys.executable, "-c", TASK],
            report={"url": sink.url, "token": "secret"},
        )
        assert run_runner(job).returncode == 0
    finally:
        sink.close()
    assert {h["path"] for h in sink.headers} == {"/api/v1/tasks/42/report"}
    assert {h["auth"] for h in sink.headers} == {"Bearer secret"}
    # The newest state at each report, in order (what piled up meanwhile goes as one).
    states = sink.states()
    assert states[-1] == "done" and states == sorted(states, key=ORDER.index), states
    exits = [p["exit"] for p in sink.posts if "exit" in p]
    assert exits == [read_json(job, "exit.json")]
    assert sink.console_text() == console(job)
    scalars = [s for p in sink.posts for s in p.get("scalars", [])]
    assert [(s["name"], s["step"]) for s in scalars] == [("loss", 0), ("loss", 1), ("loss", 2)]


def test_an_unreachable_api_does_not_fail_the_task(tmp_path):
    with socket.socket() as s:  # a port that nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = make_job(
        tmp_path,
        command=[sys.executable, "-c", "print('fine')"],
        report={"url": f"http://127.0.0.1:{port}", "token": "t"},
    )
    assert run_runner(job).returncode == 0
    assert read_json(job, "exit.json")["outcome"] == "completed"
    assert console(job) == "fine\n"


def test_an_api_that_answers_errors_does_not_fail_the_task(tmp_path):
    sink = ReportSink(status=500)
    try:
        job = make_job(
            tmp_path,
            command=[sys.executable, "-c", "print('fine')"],
            report={"url": sink.url, "token": "t"},
        )
        assert run_runner(job).returncode == 0
    finally:
        sink.close()
    assert read_json(job, "exit.json")["outcome"] == "completed"
    assert sink.posts  # it did try


def test_a_short_tasks_whole_life_takes_few_reports(tmp_path):
    """Setting up, running, done and the exit of a task that ends at once go in one report
    (two, where the machine is so slow that the start's grace runs out before the end)."""
    sink = ReportSink()
    try:
        job = make_job(tmp_path, command=["true"], report={"url": sink.url, "token": "t"})
        assert run_runner(job).returncode == 0
    finally:
        sink.close()
    assert 1 <= len(sink.posts) <= 2, sink.posts
    assert sink.states()[-1] == "done"
    assert [p["exit"] for p in sink.posts if "exit" in p] == [read_json(job, "exit.json")]


def test_a_long_tasks_start_reaches_the_server_while_it_runs(tmp_path):
    """`running` goes once its grace is over, before the end: a task that waits for a file
    shows as running before the file is there."""
    sink = ReportSink()
    release = tmp_path / "release"
    waits = f"import os, time\nwhile not os.path.exists({str(release)!r}):\n    time.sleep(0.05)\n"
    job = make_job(
        tmp_path, command=[sys.executable, "-c", waits], report={"url": sink.url, "token": "t"}
    )
    runner = start_runner(job)
    try:
        wait_for(lambda: "running" in sink.states(), what="the running report")
        assert not any("exit" in p for p in sink.posts)
        release.touch()
        assert runner.wait(timeout=60) == 0
    finally:
        release.touch()
        runner.kill()
        runner.wait()
        sink.close()
    assert sink.states()[-1] == "done"


# A task that prints for about two seconds: several reports' worth.
CHATTY = "import time\nfor i in range(20):\n    print('line', i, flush=True)\n    time.sleep(0.1)\n"


def run_chatty(tmp_path: Path, sink: ReportSink) -> Path:
    """CHATTY's job, run to its end reporting to `sink` (closed after)."""
    try:
        job = make_job(
            tmp_path,
            command=[sys.executable, "-c", CHATTY],
            report={"url": sink.url, "token": "t"},
        )
        assert run_runner(job).returncode == 0
    finally:
        sink.close()
    return job


def test_a_report_refused_for_good_stops_the_reports_quietly(tmp_path):
    """409 (the task has ended) or 401 (a requeue retired the token): the attempt is over, so
    the runner sends nothing more and its job ends as it would have."""
    sink = ReportSink(status=409)
    job = run_chatty(tmp_path, sink)
    assert read_json(job, "exit.json")["outcome"] == "completed"
    assert len(sink.posts) == 1, sink.posts


class BoundedSink(ReportSink):
    """Answers 413 to a report that carries console or scalars (the task's bound is reached)."""

    @property  # type: ignore[override]
    def status(self) -> int:
        last = self.posts[-1] if self.posts else {}
        return 413 if "console" in last or "scalars" in last else 200

    @status.setter
    def status(self, _value: int) -> None:
        pass


def test_a_report_past_a_bound_still_sends_the_state_and_the_exit(tmp_path):
    sink = BoundedSink()
    job = run_chatty(tmp_path, sink)
    assert sink.states()[-1] == "done"
    assert [p["exit"] for p in sink.posts if "exit" in p] == [read_json(job, "exit.json")]
    # After the first refusal, console and scalars stay in the job's folder only.
    refused = [p for p in sink.posts if "console" in p or "scalars" in p]
    assert len(refused) == 1, sink.posts
    assert "line 19" in console(job)
