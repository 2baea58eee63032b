"""Who a task runs as: its owner's mapped account, never root, never another user's; and it
starts from a clean environment, never the server's."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import HOST_ACCESS, ROOT, free_port, wait_for

from .conftest import (
    RESOURCE,
    SERVER_SECRET,
    SLURM,
    SLURM_SSH,
    Attack,
    everything_seen,
    slurm_estate,
    submit,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acting as alice and bob needs root")


def test_a_host_pool_without_a_user_map_runs_nothing_when_the_server_is_root(server_factory):
    server = server_factory(RESOURCE + "pools:\n  p: {kind: host, slots: 2}\n")
    with server.api() as api:
        task_id = api.post("/tasks", json={"command": ["id", "-u"]}).json()["id"]

    def explained() -> dict | None:
        why = json.loads(server.cli("why", str(task_id), "--json").output)
        return why if why["waiting"] else None

    why = wait_for(explained, 30, "the task to be explained")
    assert "the server runs as root" in why["pools"]["p"], why
    pools = json.loads(server.cli("pools", "--json").output)
    assert pools[0]["reachable"] is False and "runs no task" in pools[0]["reason"], pools
    assert server.task(task_id)["state"] == "queued"  # it never ran, as root or anyone


@pytest.fixture
def uid0_alias() -> Iterator[str]:
    """An account that is root under another name (new for each test: one an interrupted run
    left behind does not stand in the way)."""
    name = f"klqtoor{secrets.token_hex(3)}"
    subprocess.run(
        [
            "useradd",
            "-o",
            "-u",
            "0",
            "-g",
            "0",
            "-M",
            "-d",
            "/nonexistent",
            "-s",
            "/usr/sbin/nologin",
            name,
        ],
        check=True,
    )
    yield name
    subprocess.run(["userdel", "-f", name], check=True)


@pytest.mark.parametrize("pool", ["host", SLURM])
def test_an_account_that_is_root_under_another_name_is_refused(
    server_factory, uid0_alias: str, pool: str, request: pytest.FixtureRequest
) -> None:
    if pool == "host":
        estate = RESOURCE + (
            f"pools:\n  p:\n    kind: host\n    slots: 2\n"
            f"    {HOST_ACCESS.replace('alice: alice', f'alice: {uid0_alias}')}\n"
        )
    else:
        job_root = request.getfixturevalue("slurm_job_root")
        accounts = {"alice": uid0_alias, "bob": "bob"}
        estate = slurm_estate(job_root, user_map=accounts, query_account="bob")
    server = server_factory(estate)
    token = server.make_token("alice")
    with server.api(token) as api:
        task_id = api.post("/tasks", json={"command": ["id", "-u"]}).json()["id"]
    task = server.wait_state(task_id, token=token)
    assert task["state"] == "failed" and "resolves to uid 0" in task["reason"], task


def test_the_estate_refuses_root_by_name(tmp_path: Path) -> None:
    estate = tmp_path / "e.yaml"
    estate.write_text(
        RESOURCE + "pools:\n  p: {kind: host, user_map: {alice: root}, job_root: /tmp}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "broker", "estate", "check", "--file-only", str(estate)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2
    assert "pools.p.user_map.alice: 'root' is not an ordinary Linux account" in done.stderr


def test_a_single_user_pool_runs_only_the_tasks_of_the_servers_account(
    tmp_path: Path, installed_klique: Path
) -> None:
    """The server runs as alice (Klique installed from its wheel) with the embedded estate:
    alice's tasks run as alice; bob's are refused with the reason."""
    home = Path("/tmp") / f"klique-alice-home-{tmp_path.name}"
    port = free_port()
    argv = [str(installed_klique / "klique"), "server", "--port", str(port)]
    argv += ["--routes-port", str(free_port())]
    server = subprocess.Popen(
        ["runuser", "-u", "alice", "--", "env", f"KLIQUE_HOME={home}", *argv],
        cwd="/",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import httpx

        url = f"http://127.0.0.1:{port}/api/v1"
        wait_for(lambda: (home / "admin.token").exists(), 60, "the admin token")
        admin = (home / "admin.token").read_text().strip()

        def api(token: str) -> httpx.Client:
            return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"})

        wait_for(lambda: _answers(url), 60, "the server")
        with api(admin) as client:
            assert client.get("/whoami").json()["user"] == "alice"
            bob = client.post("/tokens", json={"user": "bob"}).json()["token"]
            mine = client.post("/tasks", json={"command": ["id", "-un"]}).json()["id"]
        with api(bob) as client:
            theirs = client.post("/tasks", json={"command": ["id", "-un"]}).json()["id"]

        def final(token: str, task_id: int) -> dict | None:
            with api(token) as client:
                task = client.get(f"/tasks/{task_id}").json()
            return task if task["state"] in ("completed", "failed") else None

        assert wait_for(lambda: final(admin, mine), 60, "alice's task")["state"] == "completed"
        with api(admin) as client:
            assert client.get(f"/tasks/{mine}/logs").json()["text"].strip().endswith("alice")
        refused = wait_for(lambda: final(bob, theirs), 60, "bob's task")
        assert refused["state"] == "failed"
        said = "runs only the tasks of alice, the account running the server"
        assert said in refused["reason"], refused
    finally:
        server.terminate()
        server.wait(20)
        subprocess.run(["rm", "-rf", str(home)], check=False)


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.parametrize("pool", ["host", SLURM, SLURM_SSH])
def test_a_task_never_sees_the_servers_environment(attack_factory, pool: str) -> None:
    attack: Attack = attack_factory(pool)
    task_id = submit(attack, attack.bob, "env; cat /proc/$PPID/environ | tr '\\0' '\\n'")
    task = attack.server.wait_state(task_id, token=attack.bob)
    assert task["state"] == "completed", task
    seen = everything_seen(attack, task_id, attack.bob)
    assert "PATH=" in seen  # the environment was printed
    assert SERVER_SECRET not in seen and "KLIQUE_HOME" not in seen and "KLIQUE_DB" not in seen
    job_dir = Path(task["job_dir"])
    for path in job_dir.rglob("*"):
        if path.is_file():
            assert SERVER_SECRET.encode() not in path.read_bytes(), path
