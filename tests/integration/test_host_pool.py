"""End to end on the host pool: the CLI talks to a real server that runs the real runner."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import (
    HOST_ACCESS,
    HOST_ESTATE,
    TASK_PY,
    TRUST_CHECKOUTS,
    shared_folder,
    submitted_id,
    wait_for,
)

PY = TASK_PY  # the tasks run as alice, with the system's interpreter


@pytest.fixture(scope="module")
def host_server(module_server_factory):
    """One server for this module's tests (each start costs seconds): each test waits for
    its own tasks and looks only at them."""
    return module_server_factory(HOST_ESTATE)


def test_a_task_completes_and_its_output_is_in_the_logs(host_server):
    result = host_server.cli(
        "submit",
        "--no-code",
        "--json",
        "--name",
        "hello",
        "--",
        PY,
        "-c",
        "print('hello from the task'); print('second line')",
    )
    task_id = submitted_id(result)
    task = host_server.wait_state(task_id)
    assert task["state"] == "completed" and task["exit_code"] == 0 and task["pool"] == "local"
    logs = host_server.cli("logs", str(task_id))
    assert logs.exit_code == 0
    assert "hello from the task\nsecond line\n" in logs.output
    job_dir = Path(task["job_dir"])
    assert json.loads((job_dir / "exit.json").read_text())["exit_code"] == 0
    assert json.loads((job_dir / "task.json").read_text())["name"] == "hello"


def test_a_failing_command_fails_with_its_exit_code(host_server):
    task_id = submitted_id(
        host_server.cli(
            "submit", "--no-code", "--json", "--", PY, "-c", "import sys; print('bad'); sys.exit(3)"
        )
    )
    task = host_server.wait_state(task_id)
    assert task["state"] == "failed" and task["exit_code"] == 3
    shown = host_server.cli("show", str(task_id))
    assert "failed" in shown.output and "exit_code:  3" in shown.output


def test_a_command_that_does_not_exist_fails_with_a_reason(host_server):
    task_id = submitted_id(
        host_server.cli("submit", "--no-code", "--json", "--", "no-such-program-klique", "--flag")
    )
    task = host_server.wait_state(task_id)
    assert task["state"] == "failed"
    assert "no-such-program-klique" in task["reason"]


def test_wait_exits_with_the_tasks_status(host_server):
    ok = host_server.cli("submit", "--no-code", "--wait", "--", PY, "-c", "print(1)")
    assert ok.exit_code == 0 and "completed" in ok.output
    bad = host_server.cli("submit", "--no-code", "--wait", "--", PY, "-c", "raise SystemExit(4)")
    assert bad.exit_code == 4 and "failed" in bad.output


def test_cancel_stops_a_long_task_and_its_process_is_gone(host_server):
    task_id = submitted_id(
        host_server.cli(
            "submit",
            "--no-code",
            "--json",
            "--",
            PY,
            "-c",
            "import os, time; print(os.getpid(), flush=True); time.sleep(600)",
        )
    )
    task = host_server.wait_state(task_id, {"running"})

    def printed_pid() -> str:
        lines = host_server.cli("logs", str(task_id)).output.splitlines()
        return lines[-1] if lines and lines[-1].isdigit() else ""

    pid = int(wait_for(printed_pid, 30, "the task to print its pid"))
    result = host_server.cli("cancel", str(task_id))
    assert result.exit_code == 0 and "cancelled" in result.output
    assert host_server.task(task_id)["state"] == "cancelled"

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"

    wait_for(gone, 30, f"process {pid} to end")
    assert task["pool"] == "local"


@pytest.fixture
def repo(monkeypatch):
    """Where a checkout of alice's is made: the task runs as alice and clones it. The test
    process (root) reads it too, so git is told to trust a checkout it does not own."""
    folder = shared_folder("klique-repo-")
    for key, value in TRUST_CHECKOUTS.items():
        monkeypatch.setenv(key, value)
    yield folder / "repo"
    shutil.rmtree(folder, ignore_errors=True)


def give_to_alice(repo: Path) -> None:
    subprocess.run(["chown", "-R", "alice:alice", str(repo)], check=True)


def test_a_task_from_a_git_checkout_runs_the_uncommitted_code(host_server, repo):
    repo.mkdir()
    git = ["git", "-c", "user.email=a@example.com", "-c", "user.name=A"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "train.py").write_text("print('committed version')\n")
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "one"], cwd=repo, check=True)
    (repo / "train.py").write_text("print('changed, not committed')\n")
    (repo / "extra.py").write_text("VALUE = 'untracked file too'\n")
    give_to_alice(repo)
    result = host_server.cli(
        "submit",
        "--json",
        "--",
        PY,
        "-c",
        "import runpy, extra; runpy.run_path('train.py'); print(extra.VALUE)",
        cwd=repo,
    )
    task_id = submitted_id(result)
    task = host_server.wait_state(task_id)
    logs = host_server.cli("logs", str(task_id)).output
    assert task["state"] == "completed", (task, logs)
    assert "changed, not committed" in logs and "untracked file too" in logs
    assert "committed version" not in logs
    assert (repo / "train.py").read_text() == "print('changed, not committed')\n"
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    assert "?? extra.py" in status  # the user's index is untouched


def test_a_diff_that_does_not_apply_fails_the_task_naming_the_file(host_server, repo):
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("one\n")
    git = ["git", "-c", "user.email=a@example.com", "-c", "user.name=A"]
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "one"], cwd=repo, check=True)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    give_to_alice(repo)
    diff = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-something else\n+two\n"
    with host_server.api() as api:
        task = api.post(
            "/tasks",
            json={
                "command": ["cat", "a.txt"],
                "code": {"repo": str(repo), "commit": commit, "diff": diff},
            },
        ).json()
    done = host_server.wait_state(task["id"])
    assert done["state"] == "failed" and "a.txt" in done["reason"]


def test_bad_input_gets_clear_errors(host_server):
    with host_server.api() as api:
        before = [t["id"] for t in api.get("/tasks").json()]
    unknown = host_server.cli("submit", "--no-code", "--resource", "9-gpu", "--", "true")
    assert unknown.exit_code == 1
    assert "unknown compute resource '9-gpu'" in unknown.output and "cpu" in unknown.output
    bad_token = host_server.cli("ls", token="forged")
    assert bad_token.exit_code == 1 and "refused the token" in bad_token.output
    with host_server.api() as api:
        # nothing was recorded for the refused submission
        assert [t["id"] for t in api.get("/tasks").json()] == before


def test_an_unreachable_server_is_one_line_and_non_zero(tmp_path):
    env = {**os.environ, "KLIQUE_API": "http://127.0.0.1:9", "KLIQUE_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "broker", "ls"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert done.stderr.startswith("klique: cannot reach the Klique server at http://127.0.0.1:9")
    assert done.stderr.count("\n") == 1


def test_listings_have_json_and_tables(host_server):
    task_id = submitted_id(host_server.cli("submit", "--no-code", "--json", "--", "true"))
    host_server.wait_state(task_id)
    table = host_server.cli("ls").output.splitlines()
    assert table[0].split()[:3] == ["ID", "STATE", "RESOURCE"]
    assert table[1].split()[:2] == [str(task_id), "completed"]
    rows = json.loads(host_server.cli("ls", "--json").output)
    assert rows[0]["id"] == task_id
    assert json.loads(host_server.cli("resources", "--json").output)[0]["name"] == "cpu"
    pools = json.loads(host_server.cli("pools", "--json").output)
    assert pools[0]["name"] == "local" and pools[0]["kind"] == "host"


def test_users_see_only_their_own_tasks(host_server):
    alice, bob = host_server.make_token("alice"), host_server.make_token("bob")
    task_id = submitted_id(
        host_server.cli("submit", "--no-code", "--json", "--", "true", token=alice)
    )
    assert host_server.task(task_id, alice)["owner"] == "alice"
    shown = host_server.cli("show", str(task_id), token=bob)
    assert shown.exit_code == 1 and f"no task {task_id}" in shown.output
    assert json.loads(host_server.cli("ls", "--json", token=bob).output) == []


def test_the_openapi_document_is_served(host_server):
    doc = httpx.get(host_server.url + "/openapi.json", timeout=60).json()
    assert "/api/v1/tasks" in doc["paths"] and "/api/v1/tasks/{task_id}/why" in doc["paths"]


ONE_SLOT = (
    """
teams:
  vision: [alice]
resources:
  cpu:
    profile: {cpus: 1, memory: 1G, walltime: 1h, pools: [local]}
pools:
  local:
    kind: host
    slots: 1
    """
    + HOST_ACCESS
    + """
policies:
  vision:
    resources: [cpu]
    limit: {cpu: 1}
"""
)


def test_why_explains_a_waiting_task_and_it_starts_when_the_slot_frees(server_factory):
    server = server_factory(ONE_SLOT)
    alice = server.make_token("alice")
    first = submitted_id(
        server.cli("submit", "--no-code", "--json", "--", "sleep", "600", token=alice)
    )
    server.wait_state(first, {"running"}, token=alice)
    second = submitted_id(server.cli("submit", "--no-code", "--json", "--", "true", token=alice))
    why = wait_for(
        lambda: (
            json.loads(server.cli("why", str(second), "--json", token=alice).output)["waiting"]
            and json.loads(server.cli("why", str(second), "--json", token=alice).output)
        ),
        30,
        "the second task to wait",
    )
    assert why["primary"] == "over-limit" and why["state"] == "queued"
    shown = server.cli("why", str(second), token=alice).output
    assert f"task {second} waits [over-limit]" in shown
    assert server.cli("why", str(first), token=alice).output.startswith(
        f"task {first} is not waiting: it is running"
    )
    listed = json.loads(server.cli("ls", "--json", token=alice).output)
    assert next(t for t in listed if t["id"] == second)["reason"].startswith(
        "the team is at its limit"
    )
    server.cli("cancel", str(first), token=alice)
    assert server.wait_state(second, token=alice)["state"] == "completed"


def test_a_preempted_host_task_is_requeued_and_runs_again(server_factory):
    """Reclaim on a host pool: bob borrows alice's reserved slot and hands it back."""
    server = server_factory(RECLAIM_ESTATE)
    alice, bob = server.make_token("alice"), server.make_token("bob")
    borrowed = submitted_id(
        server.cli(
            "submit", "--no-code", "--json", "--", "sh", "-c", "echo run; sleep 600", token=bob
        )
    )
    assert server.wait_state(borrowed, {"running"}, token=bob)["borrowed"] is True
    mine = submitted_id(server.cli("submit", "--no-code", "--json", "--", "true", token=alice))
    assert server.wait_state(mine, token=alice, timeout=60)["state"] == "completed"
    back = server.wait_state(borrowed, {"queued", "placed", "submitted", "running"}, token=bob)
    shown = json.loads(server.cli("show", str(borrowed), "--json", token=bob).output)
    history = [e["to"] for e in shown["events"]]
    assert history[:4] == ["queued", "placed", "submitted", "running"]
    assert "queued" in history[4:], history
    assert back["state"] in ("queued", "placed", "submitted", "running")
    server.cli("cancel", str(borrowed), token=bob)  # its second run leaves nothing behind
    assert server.wait_state(borrowed, token=bob)["state"] == "cancelled"


RECLAIM_ESTATE = (
    """
defaults:
  min_run: 0s
  reclaim_grace: 0s
teams:
  vision: [alice]
  nlp: [bob]
resources:
  cpu:
    profile: {cpus: 1, memory: 1G, walltime: 1h, pools: [local]}
pools:
  local:
    kind: host
    slots: 1
    """
    + HOST_ACCESS
    + """
policies:
  vision:
    resources: [cpu]
    reservation: {cpu: 1}
  nlp:
    resources: [cpu]
"""
)


def test_a_task_with_requirements_runs_with_those_packages(host_server):
    code = "import six; print('six', six.__version__)"
    first = submitted_id(
        host_server.cli(
            "submit",
            "--no-code",
            "--json",
            "--requirement",
            "six==1.16.0",
            "--",
            "python",
            "-c",
            code,
        )
    )
    assert host_server.wait_state(first, timeout=120)["state"] == "completed"
    assert "six 1.16.0" in host_server.cli("logs", str(first)).output
    second = submitted_id(
        host_server.cli(
            "submit",
            "--no-code",
            "--json",
            "--requirement",
            "six==1.16.0",
            "--",
            "python",
            "-c",
            code,
        )
    )
    assert host_server.wait_state(second, timeout=120)["state"] == "completed"
    logs = host_server.cli("logs", str(second)).output
    assert "reusing environment" in logs and "six 1.16.0" in logs


def test_the_runner_reports_over_http_console_scalars_and_state(host_server):
    code = (
        "from inside_job import report\n"
        "print('over the wire', flush=True)\n"
        "report.scalar('loss', 0.25, step=3)\n"
    )
    task_id = submitted_id(host_server.cli("submit", "--no-code", "--json", "--", PY, "-c", code))
    task = host_server.wait_state(task_id)
    assert task["state"] == "completed", task
    copy = host_server.home / "console" / f"{task_id}.log"
    wait_for(
        lambda: copy.exists() and "over the wire" in copy.read_text(),
        30,
        "the console to arrive over HTTP",
    )
    shown = json.loads(host_server.cli("show", str(task_id), "--json").output)
    assert [(s["name"], s["value"], s["step"]) for s in shown["scalars"]] == [("loss", 0.25, 3)]
    assert "loss = 0.25 (step 3)" in host_server.cli("show", str(task_id)).output
