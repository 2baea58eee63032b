"""Every mistake a user can make at the command line answers the same way: one line on stderr,
ending in a newline, that names what was wrong, where, and how to fix it; a non-zero exit; no
traceback. And why a task waits is said once, in `why`, in `ls` and on its page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result
from conftest import HOST_ACCESS, ROOT, TASK_PY, Server, free_port, submitted_id, wait_for

from broker.cli import main
from broker.cli.platform import ROOT_WITHOUT_ESTATE
from broker.client import one_line

ESTATE = f"""
teams:
  vision: [alice, carol]
resources:
  cpu:
    profile: {{cpus: 1, memory: 100M, walltime: 10m, pools: [p]}}
pools:
  p:
    kind: host
    slots: 1
    {HOST_ACCESS}
"""

SLEEPER = ["--no-code", "--json", "--", TASK_PY, "-c", "import time; time.sleep(120)"]

# Names quoted and then possessed: "pool 'slurm-a''s user_map".
AWKWARD = re.compile(r"'[^' ]+''s\b")


def one_line_error(result: Result, *words: str) -> str:
    """The answer to a mistake: checked as the module docstring says, holding `words`."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output, result.output
    said = result.stderr
    assert said.endswith("\n") and said.count("\n") == 1, repr(said)
    assert not AWKWARD.search(said), said
    for word in words:
        assert word in said, (word, said)
    return said


def run(*args: str, api: str, token: str = "nonsense", home: Path) -> Result:
    env = {"KLIQUE_API": api, "KLIQUE_HOME": str(home), "KLIQUE_TOKEN": token}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


@pytest.fixture(scope="module")
def server(module_server_factory) -> Server:
    return module_server_factory(ESTATE)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("show", "999999"), ("999999", "klique ls")),
        (("why", "999999"), ("999999",)),
        (("logs", "999999"), ("999999",)),
        (("cancel", "999999"), ("999999",)),
    ],
)
def test_an_unknown_task_is_named(server: Server, args: tuple[str, ...], words: tuple[str]):
    one_line_error(server.cli(*args), *words)


def test_a_wrong_compute_resource_is_named_with_the_known_ones(server: Server) -> None:
    refused = server.cli("submit", "--no-code", "-r", "gpu-99", "--", "true")
    one_line_error(refused, "gpu-99", "cpu")


def test_an_unmapped_user_is_told_whom_to_ask(server: Server) -> None:
    carol = server.make_token("carol")
    ended = server.cli("submit", "--no-code", "--wait", "--", "true", token=carol)
    said = one_line_error(ended, "user carol is not in the user_map of pool p", "fix:")
    assert said.startswith("task ") and "failed" in said


def test_an_expired_token_says_to_log_in_again(server: Server) -> None:
    with server.api() as api:
        token = api.post("/tokens", json={"user": "alice", "expires_in": 1}).json()["token"]
    expired = wait_for(lambda: server.cli("ls", token=token).exit_code != 0, 30, "the end")
    assert expired
    one_line_error(server.cli("ls", token=token), server.url, "expired", "klique login")


def test_a_server_that_is_down_is_named_with_how_to_start_one(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    one_line_error(run("ls", api=down, home=tmp_path), down, "klique server", "KLIQUE_API")


@pytest.mark.parametrize("path", ["/klique", "/api/v1", "/tasks"])
def test_a_wrong_server_url_is_named_with_the_right_form(
    server: Server, tmp_path: Path, path: str
) -> None:
    wrong = server.url + path
    said = one_line_error(run("ls", api=wrong, token=server.token, home=tmp_path), wrong)
    assert "KLIQUE_API" in said and "not answer as a Klique server" in said


def test_a_url_without_a_scheme_is_named(tmp_path: Path) -> None:
    one_line_error(run("ls", api="127.0.0.1:8765", home=tmp_path), "127.0.0.1:8765", "http://")


BAD_LINE = "resources:\n  cpu:\n    profile: {cpus: 1, memory: 1Q, walltime: 1h, pools: [p]}\n"


def test_a_bad_estate_line_is_named_by_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "estate.yaml"
    bad.write_text(BAD_LINE + "pools:\n  p: {kind: host}\n")
    checked = run("estate", "check", str(bad), api="http://127.0.0.1:1", home=tmp_path)
    one_line_error(checked, f"{bad}:3:", "memory", "fix:")


def test_the_server_names_a_bad_estate_line_at_start_and_ends_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "estate.yaml"
    bad.write_text(BAD_LINE + "pools:\n  p: {kind: host}\n")
    started = subprocess.run(
        [sys.executable, "-m", "broker", "server", "--estate", str(bad), "--port", "1"],
        env={"KLIQUE_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 2 and "Traceback" not in started.stderr, started.stderr
    assert started.stderr.endswith("\n") and started.stderr.count("\n") == 1, started.stderr
    assert started.stderr.startswith(f"{bad}:3: resources.cpu.profile.memory:")


def test_a_message_of_several_lines_is_printed_as_one() -> None:
    assert one_line("two problems:\n  the first\nthe second\n") == (
        "two problems: the first; the second"
    )
    assert one_line("") and "\n" not in one_line("")


@pytest.mark.skipif(os.geteuid() != 0, reason="the built-in pool refuses only a root server")
def test_a_root_server_without_an_estate_says_so_at_start_and_at_submit(server_factory) -> None:
    assert "\n" not in ROOT_WITHOUT_ESTATE and ROOT_WITHOUT_ESTATE.count("; fix: ") == 1
    server = server_factory()
    assert f"klique: {ROOT_WITHOUT_ESTATE}\n" in (server.home / "server.log").read_text()

    def stopped() -> bool:
        with server.api() as api:
            return "runs as root" in api.get("/pools").json()[0]["reason"]

    wait_for(stopped, 60, "the built-in pool's start-up check")
    queued = server.cli("submit", "--no-code", "--", "true")
    assert queued.exit_code == 0 and queued.stdout.startswith("task "), queued.output
    said = queued.stderr
    assert said.endswith("\n") and said.count("\n") == 1, said
    assert "is queued, but no pool of cpu can start it" in said and "klique demo" in said


# -- why a task waits, said once ----------------------------------------------------------------


def sign_in(server: Server, token: str) -> httpx.Client:
    """A browser-like client signed in to the web UI with `token`."""
    client = httpx.Client(base_url=server.url, timeout=30, headers={"Accept": "text/html"})
    form = client.get("/login").text
    login_token = re.search(r'name="login_token" value="([^"]+)"', form)[1]  # type: ignore[index]
    answer = client.post("/login", data={"token": token, "login_token": login_token})
    assert answer.status_code == 303, answer.text
    return client


def repeated_clauses(line: str) -> list[str]:
    clauses = [c.strip(" )") for c in re.split(r"[:;(]", line) if c.strip(" )")]
    return sorted({c for c in clauses if clauses.count(c) > 1})


def test_why_ls_and_the_page_say_the_reason_once(server: Server) -> None:
    alice = server.make_token("alice")
    first = submitted_id(server.cli("submit", *SLEEPER, token=alice))
    server.wait_state(first, {"running"}, token=alice)  # it holds the one slot to the end
    second = submitted_id(server.cli("submit", *SLEEPER, token=alice))
    try:
        sentence = "no pool in the profile can start it now"
        wait_for(
            lambda: sentence in server.cli("why", str(second), token=alice).output,
            60,
            "the second task to wait for capacity",
        )
        why = server.cli("why", str(second), token=alice).output
        listed = server.cli("ls", token=alice).output
        row = next(line for line in listed.splitlines() if line.startswith(f"{second} "))
        browser = sign_in(server, alice)
        try:
            html = browser.get(f"/tasks/{second}").text
        finally:
            browser.close()
        section = re.search(r'<section class="why".*?</section>', html, re.S)
        assert section is not None, html[-3000:]
        page = re.sub(r"<[^>]+>", " ", section[0])
        for shown in (why, row, page):
            assert shown.count(sentence) == 1, shown
        assert repeated_clauses(why.splitlines()[0]) == [], why
    finally:
        server.cli("cancel", str(first), str(second), token=alice)


# -- an empty listing says so, and what to do next ----------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("ls",), "no tasks yet; submit one with `klique submit -- python train.py`\n"),
        (("ls", "--state", "failed"), "no tasks match; list them all with `klique ls`\n"),
        (("app", "ls"), "no apps are running; start one with `klique app launch NAME`\n"),
    ],
)
def test_an_empty_listing_says_what_to_do_next(server: Server, args: tuple[str], said: str):
    listed = server.cli(*args, token=server.make_token("bob"))
    assert listed.exit_code == 0 and listed.output == said, listed.output
    assert server.cli(*args, "--json", token=server.make_token("bob")).output.strip() == "[]"


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/tasks", "No tasks yet. Submit one with klique submit -- python train.py ."),
        ("/tasks?state=failed", "No tasks match these filters: show all your tasks"),
        ("/apps", "No app is running. Launch one below, or with klique app launch NAME ."),
    ],
)
def test_an_empty_page_says_what_to_do_next(server: Server, path: str, said: str) -> None:
    browser = sign_in(server, server.make_token("bob"))
    try:
        html = browser.get(path).text
    finally:
        browser.close()
    empty = re.search(r'class="empty"[^>]*>(.*?)</(p|td)>', html, re.S)
    assert empty is not None, html[-2000:]
    assert said in " ".join(re.sub(r"<[^>]+>", " ", empty[1]).split()), empty[1]
