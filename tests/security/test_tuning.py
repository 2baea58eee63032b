"""Attacks on tuning: tuning a task one may not read (its parameters, code and command would be
run, and its settings read back), running trials as the base task's owner (spending another
user's policies and ledger), reading or stopping another's tuning, and a job's report token
starting tunings as its owner."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import HOST_ACCESS, Server, wait_for

ESTATE = (
    "teams:\n  vision: [alice]\n  nlp: [bob]\n"
    "resources:\n  cpu:\n    profile: {cpus: 1, memory: 200M, walltime: 10m, pools: [p]}\n"
    f"pools:\n  p:\n    kind: host\n    slots: 2\n    {HOST_ACCESS}\n"
)
# A long-running trial: the tests look at the trials' records, never at their outcome.
SLEEP = ["python3", "-c", "import time; time.sleep(60)"]


@pytest.fixture(scope="module")
def server(module_server_factory) -> Server:
    return module_server_factory(ESTATE)


def api(server: Server, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def recorded(server: Server, token: str) -> dict[str, Any]:
    """A run recorded where it runs (no pool), with parameter x: a base task."""
    with api(server, token) as http:
        run = http.post("/sdk/tasks", json={"command": SLEEP, "parameters": {"x": 1.0}})
    assert run.status_code == 201, run.text
    return run.json()  # type: ignore[no-any-return]


def tuning(base: int, **extra: Any) -> dict[str, Any]:
    return {
        "base_task": base,
        "params": ["x=uniform:0:1"],
        "objective": "loss",
        "trials": 2,
        "concurrency": 2,
        "resource": "cpu",
        **extra,
    }


def test_a_user_cannot_tune_a_task_they_may_not_read(server: Server) -> None:
    alice, bob = server.make_token("alice"), server.make_token("bob")
    base = recorded(server, alice)["id"]
    with api(server, bob) as http:
        refused = http.post("/tunings", json=tuning(base))
        missing = http.post("/tunings", json=tuning(base + 10_000))
        listed = http.get("/tunings").json()
    assert refused.status_code == 404, refused.text
    # The same answer as for a task that does not exist: nothing said of alice's task.
    assert refused.json()["detail"].replace(str(base), "N") == missing.json()["detail"].replace(
        str(base + 10_000), "N"
    )
    assert listed == []
    with api(server, server.token) as http:
        every = http.get("/tunings", params={"all": "true"}).json()
    assert [t for t in every if t["owner"] == "bob"] == []


def test_trials_run_as_the_tuning_owner_never_as_the_base_task_owner(server: Server) -> None:
    """An admin may read alice's task and tune it: the trials are the admin's tasks, under the
    admin's policies and ledger, not alice's."""
    alice = server.make_token("alice")
    base = recorded(server, alice)["id"]
    with api(server, server.token) as http:
        admin = http.get("/whoami").json()["user"]
        made = http.post("/tunings", json=tuning(base, name="as admin"))
        assert made.status_code == 201, made.text
        tuning_id = made.json()["id"]
        trials = wait_for(
            lambda: [
                t for t in http.get(f"/tunings/{tuning_id}").json()["trial_list"] if t["task_id"]
            ],
            60,
            "the first trials",
        )
        owners = {http.get(f"/tasks/{t['task_id']}").json()["owner"] for t in trials}
        http.post(f"/tunings/{tuning_id}/stop")
    assert admin != "alice"
    assert owners == {admin}
    with api(server, alice) as http:
        for trial in trials:  # alice does not even see them
            assert http.get(f"/tasks/{trial['task_id']}").status_code == 404


def test_another_user_cannot_read_or_stop_a_tuning(server: Server) -> None:
    alice, bob = server.make_token("alice"), server.make_token("bob")
    base = recorded(server, alice)["id"]
    with api(server, alice) as http:
        made = http.post("/tunings", json=tuning(base, trials=1, concurrency=1))
        assert made.status_code == 201, made.text
        tuning_id = made.json()["id"]
    with api(server, bob) as http:
        shown = http.get(f"/tunings/{tuning_id}")
        stopped = http.post(f"/tunings/{tuning_id}/stop")
    assert (shown.status_code, stopped.status_code) == (404, 404), (shown.text, stopped.text)
    with api(server, alice) as http:
        assert http.get(f"/tunings/{tuning_id}").json()["state"] == "running"
        http.post(f"/tunings/{tuning_id}/stop")


def test_a_jobs_report_token_cannot_start_a_tuning(server: Server) -> None:
    alice = server.make_token("alice")
    run = recorded(server, alice)
    with api(server, run["report_token"]) as http:
        refused = http.post("/tunings", json=tuning(run["id"]))
    assert refused.status_code in (401, 403), refused.text
