"""An agent token acts for its own pools' tasks only, also when it reports a batch: a batch of
attempts, accepted jobs or observations that names one task of another pool is refused whole,
and nothing of it is recorded."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import HOST_ACCESS

ESTATE = f"""
resources:
  a: {{profile: {{cpus: 1, memory: 200M, walltime: 10m, pools: [a]}}}}
  b: {{profile: {{cpus: 1, memory: 200M, walltime: 10m, pools: [b]}}}}
pools:
  a:
    kind: host
    agent: remote
    {HOST_ACCESS}
  b:
    kind: host
    agent: remote
    {HOST_ACCESS}
"""
DIGEST = "0" * 64


@pytest.fixture
def placed(server_factory: Any) -> tuple[Any, dict[str, str], dict[str, int]]:
    """A server with two remote pools, an agent token for each, and a task placed in each."""
    server = server_factory(ESTATE)
    with server.api() as api:
        tokens = {
            pool: api.post("/agent-tokens", json={"pools": [pool]}).json()["token"]
            for pool in ("a", "b")
        }
    for pool, token in tokens.items():
        with server.api(token) as agent:
            published = {"op": "published", "state": {"free_slots": 4}}
            answer = agent.post(f"/agent/pools/{pool}/calls", json={"calls": [published]})
            answer.raise_for_status()
    ids = {}
    with server.api(server.make_token("alice")) as alice:
        for pool in ("a", "b"):
            made = alice.post("/tasks", json={"command": ["true"], "resource": pool})
            ids[pool] = made.json()["id"]
    for task_id in ids.values():
        server.wait_state(task_id, {"placed"})
    return server, tokens, ids


def calls(op: str, *task_ids: int) -> dict[str, Any]:
    fields = {
        "begin": {"job_dir": "/jobs/x", "digest": DIGEST},
        "submitted": {"native_id": "7"},
        "observed": {"observation": {"state": "running", "reason": "R"}},
    }[op]
    return {"calls": [{"op": op, "task_id": i, **fields} for i in task_ids]}


def test_a_batch_naming_another_pools_task_is_refused_whole(placed) -> None:
    server, tokens, ids = placed
    with server.api(tokens["a"]) as agent:
        for op in ("begin", "submitted"):
            refused = agent.post("/agent/pools/a/calls", json=calls(op, ids["a"], ids["b"]))
            assert refused.status_code == 404, refused.text
            assert refused.json()["detail"].startswith(f"no task {ids['b']} in pool a")
            # A task that does not exist gets the same answer: no oracle of other pools' ids.
            missing = max(ids.values()) + 1000
            unknown = agent.post("/agent/pools/a/calls", json=calls(op, ids["a"], missing))
            assert unknown.status_code == 404, unknown.text
            assert unknown.json()["detail"].startswith(f"no task {missing} in pool a")
        other = agent.post("/agent/pools/b/calls", json=calls("begin", ids["b"]))
        assert other.status_code == 403 and "does not serve pool 'b'" in other.text
    for task_id in ids.values():  # nothing of the refused batches was recorded
        task = server.task(task_id)
        assert (task["state"], task["job_dir"], task["native_id"]) == ("placed", None, None)
    # The control: the same batches for the pool's own task are recorded.
    with server.api(tokens["a"]) as agent:
        begun = agent.post("/agent/pools/a/calls", json=calls("begin", ids["a"]))
        assert begun.status_code == 200 and begun.json()["results"][0]["job_dir"] == "/jobs/x"
        accepted = agent.post("/agent/pools/a/calls", json=calls("submitted", ids["a"]))
        assert accepted.json() == {"results": [True]}
    task = server.task(ids["a"])
    assert (task["state"], task["native_id"]) == ("submitted", "7")
    # A look's observations go as one batch too: one of another pool's task refuses it whole.
    with server.api(tokens["a"]) as agent:
        refused = agent.post("/agent/pools/a/calls", json=calls("observed", ids["a"], ids["b"]))
        assert refused.status_code == 404, refused.text
        assert server.task(ids["a"])["state"] == "submitted"
        assert server.task(ids["b"])["state"] == "placed"
        seen = agent.post("/agent/pools/a/calls", json=calls("observed", ids["a"]))
        assert seen.json() == {"results": [None]}
    assert server.task(ids["a"])["state"] == "running"
