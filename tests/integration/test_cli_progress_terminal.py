"""The CLI's long operations show progress on a terminal and stay plain when piped: `klique`
run in a pseudo-terminal draws the upload of a large diff, a sweep's finished tasks with counts
by state (`submit --wait`), and a followed task's stage (`logs -f`); the same commands piped
write plain lines, with no carriage return or escape code, and say the same ends."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import HOST_ESTATE, ROOT, TASK_PY, Server
from helpers.runner import git, make_repo

CONTROL = re.compile(r"[\r\x1b]")  # what a drawn bar writes, and plain output never does


@pytest.fixture(scope="module")
def server(module_server_factory) -> Server:
    return module_server_factory(HOST_ESTATE)


def klique_env(server: Server) -> dict[str, str]:
    return {**os.environ, **server.env(), "TERM": "xterm", "COLUMNS": "120"}


def on_a_terminal(argv: Sequence[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[int, str]:
    """`klique ARGV` with its standard streams on a pseudo-terminal: its exit and all it drew."""
    master, slave = pty.openpty()
    command = [sys.executable, "-m", "broker", *argv]
    process = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd)
    os.close(slave)
    drawn = b""
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the command has exited and its end of the terminal is closed
                break
            if not data:
                break
            drawn += data
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    return process.wait(30), drawn.decode(errors="replace")


def piped(argv: Sequence[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[int, str]:
    """`klique ARGV` with its output in pipes: its exit and its standard output and error."""
    command = [sys.executable, "-m", "broker", *argv]
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def sweep_argv(tag: str) -> list[str]:
    script = "import time, sys; time.sleep(0.5 * int(sys.argv[1]))"
    return ["submit", "--no-code", "-r", "cpu", "-n", tag + "-{x}", "--grid", "x=1,2,3",
            "--wait", "--", TASK_PY, "-c", script, "{x}"]  # fmt: skip


def test_a_sweeps_wait_draws_its_finished_tasks_on_a_terminal_only(server: Server) -> None:
    env = klique_env(server)
    code, drawn = on_a_terminal(sweep_argv("drawn"), env)
    assert code == 0, drawn
    # The bar: finished of all, and the server's counts by state, redrawn in place.
    assert re.search(r"sweep \d+: .* \d/3 finished", drawn), drawn
    assert "\r" in drawn and re.search(r"\d (queued|running|submitted|completed)", drawn)
    assert re.search(r"sweep \d+: 3 completed", drawn), drawn

    code, plain = piped(sweep_argv("plain"), env)
    assert code == 0, plain
    assert not CONTROL.search(plain), repr(plain)
    assert "finished" not in plain
    assert re.search(r"^sweep \d+: 3 tasks queued .*\nsweep \d+: 3 completed\n$", plain), plain


def test_a_large_diff_goes_up_under_a_bar_on_a_terminal_only(
    server: Server, tmp_path: Path
) -> None:
    repo, _ = make_repo(tmp_path, {"data.txt": "small\n"})
    (repo / "data.txt").write_text("changed line of data\n" * 100_000)  # a 2 MB diff
    argv = ["submit", "-r", "cpu", "-n", "big-diff", "--", TASK_PY, "-c", "print(1)"]
    env = klique_env(server)
    code, drawn = on_a_terminal(argv, env, cwd=repo)
    assert code == 0, drawn
    assert re.search(r"sending the task and its code: +\d+%", drawn), drawn
    assert re.search(r"bytes of changes", drawn)

    code, plain = piped(argv, env, cwd=repo)
    assert code == 0, plain
    assert not CONTROL.search(plain), repr(plain)
    assert "sending" not in plain and "bytes of changes" in plain
    git(repo, "status")  # the checkout is left as it was


def test_logs_follow_says_the_stage_on_a_terminal_only(server: Server) -> None:
    script = "import time; print('started', flush=True); time.sleep(3); print('finished')"
    argv = ["submit", "--no-code", "--json", "-r", "cpu", "--", TASK_PY, "-c", script]
    env = klique_env(server)
    for run in (on_a_terminal, piped):
        code, said = piped(argv, env)
        assert code == 0, said
        task_id = re.search(r'"id": (\d+)', said).group(1)  # type: ignore[union-attr]
        code, shown = run(["logs", "-f", task_id], env)
        assert code == 0, shown
        assert "started" in shown and "finished" in shown  # the console, as before
        if run is on_a_terminal:
            # The stage line, from the task's state as the server reports it, between the
            # console's lines (its own line is cleared before each is printed).
            assert re.search(rf"task {task_id}: (waiting \(\w+\)|setting up|running)", shown)
            assert "\r" in shown
        else:
            assert not CONTROL.search(shown), repr(shown)
            assert f"task {task_id}:" not in shown
