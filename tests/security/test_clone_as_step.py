"""A clone made as a pipeline's step (ClearML's add_step: `POST /sdk/tasks/ID/clone` with
`parent`) goes under a pipeline the caller acts on, or nowhere: naming another user's task
as the parent is the 404 of a task that does not exist, and no task is made."""

from __future__ import annotations

from .conftest import Attack, host_estate


def recorded(attack: Attack, token: str) -> int:
    """A run recorded where it runs (the SDK's Task.init), as the token's owner."""
    with attack.server.api(token) as api:
        answer = api.post("/sdk/tasks", json={"command": ["python3", "x.py"], "name": "run"})
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def test_a_clone_cannot_be_made_a_step_of_another_users_pipeline(server_factory) -> None:
    server = server_factory(host_estate())
    attack = Attack(
        server, "host", server.job_root, server.make_token("alice"), server.make_token("bob")
    )
    pipeline = recorded(attack, attack.alice)
    own = recorded(attack, attack.bob)
    with server.api(attack.bob) as api:
        before = len(api.get("/tasks").json())
        refused = api.post(f"/sdk/tasks/{own}/clone", json={"resource": "cpu", "parent": pipeline})
        assert refused.status_code == 404, refused.text
        assert f"no task {pipeline} of yours" in refused.json()["detail"]
        assert len(api.get("/tasks").json()) == before  # nothing was made
    with server.api(attack.alice) as api:
        steps = api.get(f"/sdk/tasks/{pipeline}/steps").json()
        assert steps == []
        allowed = api.post(
            f"/sdk/tasks/{recorded(attack, attack.alice)}/clone",
            json={"resource": "cpu", "parent": pipeline},
        )
        assert allowed.status_code == 201, allowed.text
        assert allowed.json()["parent"] == pipeline
