"""A task's report token is the control plane's to make, one per attempt, and speaks for its own
task only: an agent never chooses one; it reaches its own task, its steps and the artifacts its
task was made to read, nothing else of its owner's (404, as for a task that does not exist); a
requeue retires it; after the end it reports nothing; and what one task keeps on the server is
bounded by the estate (413, naming the limit)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from conftest import HOST_ACCESS

from broker.store.identity import token_digest

from .conftest import RESOURCE, Attack, submit

BOUNDED = (
    RESOURCE
    + f"pools:\n  p:\n    kind: host\n    slots: 2\n    {HOST_ACCESS}\n"
    + "limits: {max_console: 1M, max_scalars: 5, max_artifacts: 1M}\n"
)


def as_job(server: Any, token: str) -> httpx.Client:
    """What a job holding `token` can call."""
    return httpx.Client(
        base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def job_token(task: dict[str, Any]) -> str:
    """The report token a job reads from its own task.json, as any job can."""
    spec = json.loads((Path(task["job_dir"]) / "task.json").read_text())
    return str(spec["report"]["token"])


def local_task(api: httpx.Client, **fields: Any) -> dict[str, Any]:
    """A run recorded by the SDK where it runs: its record, with its report token."""
    body = {"command": ["python3", "train.py"], "name": "mine", **fields}
    answer = api.post("/sdk/tasks", json=body)
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def begin(agent: httpx.Client, pool: str, task_id: int, **extra: Any) -> httpx.Response:
    call = {"op": "begin", "task_id": task_id, "job_dir": f"/jobs/{task_id}", **extra}
    return agent.post(f"/agent/pools/{pool}/calls", json={"calls": [call]})


def test_an_agent_never_chooses_a_report_token(remote_pools) -> None:
    server, tokens, ids, alice = remote_pools
    chosen = "a token the agent made up for alice's task"
    with server.api(tokens["a"]) as agent:
        refused = begin(agent, "a", ids["a"], digest=token_digest(chosen))
        assert refused.status_code == 422, refused.text
        assert "the control plane makes each attempt's report token" in refused.json()["detail"]
        assert server.task(ids["a"])["job_dir"] is None  # nothing of it was recorded
        begun = begin(agent, "a", ids["a"])
        assert begun.status_code == 200, begun.text
    minted = begun.json()["results"][0]["report_token"]
    assert minted and minted != chosen
    with as_job(server, chosen) as job:  # the agent's own choice opens nothing
        assert job.get(f"/sdk/tasks/{ids['a']}").status_code == 401
    with server.api(alice) as api:
        theirs = local_task(api)["id"]
        put = api.put(f"/tasks/{theirs}/artifacts/model", content=b"alice's weights")
        assert put.status_code == 201
    with as_job(server, minted) as job:
        assert job.get(f"/sdk/tasks/{ids['a']}").status_code == 200  # its own task
        # Alice's other tasks (here, one on pool b; and one recorded by her SDK) are out of reach.
        step = {"command": ["true"], "resource": "b", "parent": ids["b"]}
        assert job.post("/sdk/tasks", json=step).status_code == 404
        assert job.get(f"/sdk/tasks/{ids['b']}").status_code == 404
        assert job.get(f"/tasks/{theirs}/artifacts/model").status_code == 404
        assert job.get(f"/tasks/{theirs}/artifacts").status_code == 404
        pickled = job.put(f"/tasks/{theirs}/artifacts/model", content=b"\x80\x04forged")
        assert pickled.status_code == 404
        assert job.post(f"/sdk/tasks/{ids['b']}/cancel").status_code == 404
    with server.api(alice) as api:
        assert api.get(f"/tasks/{theirs}/artifacts/model").content == b"alice's weights"
    assert server.task(ids["b"])["state"] == "placed"


def test_a_requeue_retires_the_attempts_report_token(remote_pools) -> None:
    server, tokens, ids, _alice = remote_pools
    task_id = ids["a"]
    calls = "/agent/pools/a/calls"
    with server.api(tokens["a"]) as agent:
        first = begin(agent, "a", task_id)
        assert first.status_code == 200, first.text
        old = first.json()["results"][0]["report_token"]
        running = {"op": "observed", "task_id": task_id, "observation": {"state": "running"}}
        submitted = {"op": "submitted", "task_id": task_id, "native_id": "1"}
        agent.post(calls, json={"calls": [submitted, running]}).raise_for_status()
        with as_job(server, old) as job:
            assert job.post(f"/tasks/{task_id}/report", json={"scalars": []}).status_code == 200
        requeue = {
            "op": "requeue",
            "task_id": task_id,
            "reason": "node lost",
            "only_from": ["running"],
        }
        agent.post(calls, json={"calls": [requeue]}).raise_for_status()
        assert server.task(task_id)["state"] in ("queued", "placed")
        with as_job(server, old) as job:  # between the attempts: no task's token
            assert job.post(f"/tasks/{task_id}/report", json={"scalars": []}).status_code == 401
            assert job.get(f"/sdk/tasks/{task_id}").status_code == 401
        server.wait_state(task_id, {"placed"})
        second = begin(agent, "a", task_id)
        assert second.status_code == 200, second.text
    new = second.json()["results"][0]["report_token"]
    assert new != old
    with as_job(server, old) as job:  # the superseded attempt still reports nothing
        assert job.post(f"/tasks/{task_id}/report", json={"scalars": []}).status_code == 401
    with as_job(server, new) as job:
        assert job.post(f"/tasks/{task_id}/report", json={"scalars": []}).status_code == 200


def test_a_report_token_reuses_only_the_outputs_of_its_own_pipeline_run(attack_factory) -> None:
    attack: Attack = attack_factory("host")
    server = attack.server
    key = "c" * 64
    with server.api(attack.alice) as alice:
        earlier = local_task(alice, cache_key=key)["id"]
        put = alice.put(f"/tasks/{earlier}/artifacts/model", content=b"alice's weights")
        assert put.status_code == 201
        ended = alice.post(f"/sdk/tasks/{earlier}/end", json={"outcome": "completed"})
        assert ended.json()["state"] == "completed"
    pipeline = submit(attack, attack.alice, "sleep 600")
    token = job_token(server.wait_state(pipeline, {"running"}, token=attack.alice))
    reuse = {"command": ["true"], "name": "train", "resource": "cpu", "reuse": earlier}
    with as_job(server, token) as job:
        assert job.get(f"/tasks/{earlier}/artifacts/model").status_code == 404  # directly
        assert job.get("/sdk/cached", params={"key": key}).status_code == 404
        taken = job.post("/sdk/tasks", json=reuse)  # and through a reuse record
        assert taken.status_code == 404, taken.text
        # The control: a step of its own run, completed, is reused, and read through the copy.
        step = {"command": ["true"], "name": "s", "resource": "cpu", "cache_key": "d" * 64}
        made = job.post("/sdk/tasks", json=step)
        assert made.status_code == 201, made.text
        own_step = made.json()["id"]
    server.wait_state(own_step, {"completed"}, token=attack.alice)
    with as_job(server, token) as job:
        assert job.put(f"/tasks/{own_step}/artifacts/out", content=b"made").status_code == 404
        cached = job.get("/sdk/cached", params={"key": "d" * 64})
        assert cached.status_code == 200 and cached.json()["id"] == own_step
        again = job.post("/sdk/tasks", json={**reuse, "reuse": own_step})
        assert again.status_code == 201, again.text
        assert again.json()["state"] == "completed"
    assert server.cli("cancel", str(pipeline), token=attack.alice).exit_code == 0


def test_reports_after_the_end_are_refused(attack_factory) -> None:
    attack: Attack = attack_factory("host")
    server = attack.server
    task_id = submit(attack, attack.bob, "sleep 600")
    token = job_token(server.wait_state(task_id, {"running"}, token=attack.bob))
    assert server.cli("cancel", str(task_id), token=attack.bob).exit_code == 0
    server.wait_state(task_id, token=attack.bob)
    late = {"console": {"offset": 0, "text": "after the end\n"}, "scalars": []}
    with as_job(server, token) as job:
        refused = job.post(f"/tasks/{task_id}/report", json=late)
        assert refused.status_code == 409, refused.text
        assert "has ended (cancelled)" in refused.json()["detail"]
        sdk = job.post(f"/sdk/tasks/{task_id}/parameters", json={"values": {"lr": 1}})
        assert sdk.status_code == 409 and "has ended" in sdk.json()["detail"]
    logs = server.cli("logs", str(task_id), token=attack.bob).output
    assert "after the end" not in logs


def test_each_per_task_bound_refuses_with_its_estate_setting(server_factory) -> None:
    server = server_factory(BOUNDED)
    with server.api() as api:
        task = local_task(api)
    task_id, token = task["id"], task["report_token"]
    report = f"/tasks/{task_id}/report"
    with as_job(server, token) as job:
        fits = job.post(report, json={"console": {"offset": 0, "text": "x" * (1 << 19)}})
        assert fits.status_code == 200, fits.text
        more = {"console": {"offset": 1 << 19, "text": "y" * (3 << 18)}}
        over = job.post(report, json=more)
        assert over.status_code == 413 and "limits.max_console" in over.json()["detail"]
        points = [{"name": "loss", "value": float(n)} for n in range(5)]
        assert job.post(report, json={"scalars": points}).status_code == 200
        over = job.post(report, json={"scalars": points[:1]})
        assert over.status_code == 413 and "limits.max_scalars" in over.json()["detail"]
        half = b"z" * (600 << 10)
        assert job.put(f"/tasks/{task_id}/artifacts/a", content=half).status_code == 201
        over = job.put(f"/tasks/{task_id}/artifacts/b", content=half)
        assert over.status_code == 413 and "limits.max_artifacts" in over.json()["detail"]
        try:  # streamed, with no length declared: refused as it passes the bound
            streamed = job.put(f"/tasks/{task_id}/artifacts/b", content=iter([half]))
            assert streamed.status_code == 413 and "limits.max_artifacts" in streamed.text
        except httpx.TransportError:
            pass  # the server may close the connection while the rest is still being sent
        # Replacing an artifact counts its new size only.
        assert job.put(f"/tasks/{task_id}/artifacts/a", content=half).status_code == 201
    with server.api() as api:
        kept = api.get(f"/tasks/{task_id}").json()
        assert [a["name"] for a in kept["artifacts"]] == ["a"]
        assert len(kept["scalars"]) == 5
        logs = api.get(f"/tasks/{task_id}/logs").json()
    assert "y" not in logs["text"]
