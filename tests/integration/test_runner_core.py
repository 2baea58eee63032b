"""The runner end to end with real processes: files, exit codes, outcomes, signals, GPUs."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest
from conftest import wait_for
from helpers.runner import (
    ReportSink,
    cache_of,
    console,
    make_job,
    read_json,
    run_runner,
    start_runner,
)

PY = sys.executable
TERMINATED = "terminated by SIGTERM (cancelled, preempted or out of walltime)"


def test_a_task_runs_and_its_console_status_and_exit_files_are_right(tmp_path):
    script = (
        "import os, sys\n"
        "print('to stdout')\n"
        "print('to stderr', file=sys.stderr)\n"
        "print('env', os.environ['GREETING'], os.environ['KLIQUE_TASK_ID'],"
        " os.environ['KLIQUE_JOB_DIR'] == os.getcwd(), os.environ['PYTHONUNBUFFERED'])\n"
    )
    job = make_job(tmp_path, command=[PY, "-c", script], env={"GREETING": "hi there"})
    result = run_runner(job)
    assert result.returncode == 0, result.stdout + result.stderr
    assert console(job) == "to stdout\nto stderr\nenv hi there 7 True 1\n"
    exit_file = read_json(job, "exit.json")
    assert exit_file["exit_code"] == 0 and exit_file["outcome"] == "completed"
    assert exit_file["signal"] is None
    assert exit_file["started"] <= exit_file["finished"]
    status = read_json(job, "status.json")
    assert status["state"] == "done" and status["host"] == os.uname().nodename


def test_a_failing_command_ends_failed_with_its_exit_code(tmp_path):
    job = make_job(tmp_path, command=[PY, "-c", "import sys; print('bad'); sys.exit(3)"])
    result = run_runner(job)
    assert result.returncode == 3
    exit_file = read_json(job, "exit.json")
    assert (exit_file["exit_code"], exit_file["outcome"]) == (3, "failed")
    assert exit_file["reason"] == "exited with code 3"


def test_a_missing_command_is_127_and_setup_failed(tmp_path):
    job = make_job(tmp_path, command=["no-such-command-klique", "--flag"])
    result = run_runner(job)
    assert result.returncode == 127
    exit_file = read_json(job, "exit.json")
    assert exit_file["outcome"] == "setup_failed" and exit_file["exit_code"] == 127
    assert exit_file["reason"] == "command not found: no-such-command-klique"
    assert exit_file["started"] is None
    assert "klique: setup failed: command not found" in console(job)


def test_an_unreadable_task_file_is_setup_failed(tmp_path):
    job = make_job(tmp_path, command="echo not-a-list")
    result = run_runner(job)
    assert result.returncode == 125
    exit_file = read_json(job, "exit.json")
    assert exit_file["outcome"] == "setup_failed" and "command" in exit_file["reason"]


def test_a_task_killed_by_a_signal_is_signalled(tmp_path):
    job = make_job(tmp_path, command=[PY, "-c", "import os; os.kill(os.getpid(), 9)"])
    result = run_runner(job)
    assert result.returncode == 128 + 9
    exit_file = read_json(job, "exit.json")
    assert exit_file["outcome"] == "signalled" and exit_file["signal"] == 9
    assert exit_file["reason"].startswith("killed by SIGKILL")


TRAP_SCRIPT = """
import signal, sys, time, os
def on(signum, frame):
    print('caught', signal.Signals(signum).name, flush=True)
    if signum == signal.SIGTERM:
        sys.exit(0)
signal.signal(signal.SIGTERM, on)
signal.signal(signal.SIGUSR1, on)
signal.signal(signal.SIGUSR2, on)
print('ready', flush=True)
while not os.path.exists('release'):
    time.sleep(0.01)
print('released', flush=True)
"""


def _running(job):
    return wait_for(lambda: "ready" in console(job), what="the task to start")


def test_sigterm_is_forwarded_and_the_task_ends_signalled(tmp_path):
    job = make_job(tmp_path, command=[PY, "-c", TRAP_SCRIPT])
    runner = start_runner(job)
    _running(job)
    assert read_json(job, "status.json")["state"] == "running"
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(60) == 0
    assert "caught SIGTERM" in console(job)
    exit_file = read_json(job, "exit.json")
    assert exit_file["outcome"] == "signalled" and exit_file["signal"] == signal.SIGTERM
    assert exit_file["reason"] == TERMINATED


def test_a_task_that_does_not_trap_sigterm_dies_with_it(tmp_path):
    job = make_job(tmp_path, command=["sh", "-c", "echo ready; exec sleep 60"])
    runner = start_runner(job)
    _running(job)
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(60) == 128 + signal.SIGTERM
    exit_file = read_json(job, "exit.json")
    assert exit_file["exit_code"] == 143 and exit_file["outcome"] == "signalled"


@pytest.mark.parametrize(
    ("signum", "scheduler"),
    [(signal.SIGUSR1, "host"), (signal.SIGUSR2, "slurm")],  # SIGUSR2 ends a run on LSF only
)
def test_a_signal_that_ends_nothing_is_forwarded_and_the_task_carries_on(
    tmp_path, signum, scheduler
):
    job = make_job(tmp_path, command=[PY, "-c", TRAP_SCRIPT], scheduler=scheduler)
    runner = start_runner(job)
    _running(job)
    runner.send_signal(signum)
    name = signal.Signals(signum).name
    wait_for(lambda: f"caught {name}" in console(job), what=f"the task to see {name}")
    (job / "release").touch()
    assert runner.wait(60) == 0
    assert read_json(job, "exit.json")["outcome"] == "completed"


def _blocked(pid: int, thread: str) -> int:
    """The signals a thread of pid blocks, as the kernel shows them (a bit per signal)."""
    status = Path(f"/proc/{pid}/task/{thread}/status").read_text()
    found = re.search(r"^SigBlk:\s*([0-9a-f]+)$", status, re.MULTILINE)
    assert found, status
    return int(found[1], 16)


def test_the_schedulers_signals_wake_the_runners_main_thread_and_no_other(tmp_path):
    """The kernel hands a signal sent to the runner to any one of its threads that does not block
    it (as when the main thread still has the SIGCONT that Slurm sends before a warning); Python
    runs the handler only once the main thread wakes, and that thread sleeps until the task
    ends. So the reporter's thread blocks every signal the runner forwards; the main one none."""
    sink = ReportSink()
    try:
        report = {"url": sink.url, "token": "t"}
        job = make_job(tmp_path, command=[PY, "-c", TRAP_SCRIPT], report=report)
        runner = start_runner(job)
        _running(job)
        threads = os.listdir(f"/proc/{runner.pid}/task")
        helpers = [t for t in threads if t != str(runner.pid)]
        names = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGCONT")
        forwarded = sum(1 << (signal.Signals[n] - 1) for n in names)
        assert helpers, threads  # the reporter's
        assert _blocked(runner.pid, str(runner.pid)) & forwarded == 0
        assert all(_blocked(runner.pid, t) & forwarded == forwarded for t in helpers)
        runner.send_signal(signal.SIGCONT)
        runner.send_signal(signal.SIGUSR1)
        wait_for(lambda: "caught SIGUSR1" in console(job), what="the task to see SIGUSR1")
        (job / "release").touch()
        assert runner.wait(60) == 0
    finally:
        sink.close()


RUN_LIMIT_SCRIPT = """
import os, signal, sys, time
def on(signum, frame):
    print('told', signal.Signals(signum).name, flush=True)
    if os.path.exists('exit-when-told'):
        sys.exit(0)
signal.signal(signal.SIGUSR2, on)
print('ready', flush=True)
while not os.path.exists('release'):
    time.sleep(0.01)
"""


def _exit_file(job):
    path = job / "exit.json"
    return wait_for(lambda: path.exists() and read_json(job, "exit.json"), what="exit.json")


def test_lsfs_run_limit_warning_reaches_the_task_and_the_run_ends_timed_out(tmp_path):
    job = make_job(tmp_path, command=[PY, "-c", RUN_LIMIT_SCRIPT], scheduler="lsf")
    runner = start_runner(job)
    _running(job)
    runner.send_signal(signal.SIGUSR2)
    wait_for(lambda: "told SIGUSR2" in console(job), what="the task to be told")
    early = _exit_file(job)  # written at once: LSF may kill the runner after its grace
    assert early["outcome"] == "timeout" and "walltime" in early["reason"]
    runner.send_signal(signal.SIGINT)  # the grace is over: LSF's kill starts with SIGINT
    runner.send_signal(signal.SIGKILL)
    runner.wait(60)
    (job / "release").touch()  # LSF would kill the task too; the runner's SIGKILL cannot
    final = read_json(job, "exit.json")
    assert (final["outcome"], final["signal"]) == ("timeout", signal.SIGUSR2)


def test_a_task_that_exits_on_lsfs_warning_still_ran_past_its_walltime(tmp_path):
    job = make_job(tmp_path, command=[PY, "-c", RUN_LIMIT_SCRIPT], scheduler="lsf")
    (job / "exit-when-told").touch()
    runner = start_runner(job)
    _running(job)
    runner.send_signal(signal.SIGUSR2)
    assert runner.wait(60) == 0
    exit_file = read_json(job, "exit.json")
    assert (exit_file["outcome"], exit_file["exit_code"]) == ("timeout", 0)
    assert exit_file["reason"] == "ran past its walltime (LSF's run limit sent SIGUSR2)"


def test_sigterm_with_the_preemption_marker_is_preempted(tmp_path):
    job = make_job(tmp_path, command=["sh", "-c", "echo ready; exec sleep 60"])
    runner = start_runner(job)
    _running(job)
    (job / "preempted").touch()
    runner.send_signal(signal.SIGTERM)
    runner.wait(60)
    exit_file = read_json(job, "exit.json")
    assert exit_file["outcome"] == "preempted" and exit_file["signal"] == signal.SIGTERM


def test_sigterm_with_klique_preempted_set_is_preempted(tmp_path):
    job = make_job(tmp_path, command=["sh", "-c", "echo ready; exec sleep 60"])
    runner = start_runner(job, KLIQUE_PREEMPTED="1")
    _running(job)
    runner.send_signal(signal.SIGTERM)
    runner.wait(60)
    assert read_json(job, "exit.json")["outcome"] == "preempted"


def test_the_console_shows_output_while_the_task_runs(tmp_path):
    job = make_job(tmp_path, command=[PY, "-c", TRAP_SCRIPT])
    runner = start_runner(job)
    _running(job)  # 'ready' is in console.log while the task still waits for 'release'
    assert not (job / "exit.json").exists()
    (job / "release").touch()
    assert runner.wait(60) == 0
    assert console(job) == "ready\nreleased\n"


def test_host_gpus_are_exactly_the_tasks_cuda_visible_devices(tmp_path):
    job = make_job(tmp_path, command=["sh", "-c", 'echo "[$CUDA_VISIBLE_DEVICES]"'], gpus=[0, 2])
    run_runner(job, CUDA_VISIBLE_DEVICES="0,1,2,3")
    assert console(job) == "[0,2]\n"


def test_no_gpus_granted_hides_every_gpu(tmp_path):
    job = make_job(
        tmp_path, command=["sh", "-c", 'echo "[${CUDA_VISIBLE_DEVICES-unset}]"'], gpus=[]
    )
    run_runner(job, CUDA_VISIBLE_DEVICES="0,1")
    assert console(job) == "[]\n"


@pytest.mark.parametrize(
    ("cuda", "shown"),
    [
        ("0,1", "[0,1]\n"),  # a device cgroup: the gres plugin numbers the two granted GPUs 0,1
        ("NoDevFiles", "[NoDevFiles]\n"),  # no CUDA numbers: the global ids never stand in
    ],
)
def test_slurm_gpus_are_numbered_by_cuda_visible_devices_never_by_global_ids(tmp_path, cuda, shown):
    job = make_job(
        tmp_path,
        command=["sh", "-c", 'echo "[$CUDA_VISIBLE_DEVICES]"'],
        scheduler="slurm",
        gpus=None,
    )
    run_runner(job, CUDA_VISIBLE_DEVICES=cuda, SLURM_JOB_GPUS="1,3")
    assert console(job) == shown


def test_a_workdir_task_runs_in_that_folder(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    job = make_job(tmp_path, command=["pwd"], code={"workdir": str(work)})
    assert run_runner(job).returncode == 0
    assert console(job) == f"{work}\n"


def test_sigterm_during_setup_ends_the_run_signalled(tmp_path):
    # A staged "uv" that blocks keeps the runner in setup until it is signalled.
    fake_uv = tmp_path / "uv"
    started = tmp_path / "setup-started"
    fake_uv.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 60\n")
    fake_uv.chmod(0o755)
    job = make_job(
        tmp_path,
        command=["true"],
        requirements=["six"],
        uv=str(fake_uv),
        package_cache=str(tmp_path / "pkg"),
    )
    runner = start_runner(job)
    wait_for(started.exists, what="setup to start")
    assert read_json(job, "status.json")["state"] == "setting_up"
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(60) == 128 + signal.SIGTERM
    exit_file = read_json(job, "exit.json")
    assert exit_file["outcome"] == "signalled" and exit_file["reason"] == TERMINATED
    assert exit_file["started"] is None
    envs = cache_of(tmp_path) / "envs"
    assert sorted(p.name for p in envs.iterdir() if ".tmp-" in p.name) == []


def test_a_rerun_in_the_same_folder_starts_without_the_earlier_runs_ending(tmp_path):
    # Slurm requeued the job (node failure, PreemptMode=REQUEUE): the runner starts again in the
    # folder where the first run's exit file lies.
    job = make_job(
        tmp_path,
        command=["sh", "-c", 'test -e "$KLIQUE_JOB_DIR/exit.json" && echo stale || echo clean'],
    )
    (job / "exit.json").write_text('{"outcome": "failed", "exit_code": 143}')
    assert run_runner(job).returncode == 0
    assert console(job) == "clean\n"
    assert read_json(job, "exit.json")["outcome"] == "completed"
