"""`klique why` for a task whose submission's reply was lost on a pool served by `klique
agent`: the agent carries the reason to the control plane with its pool's state, as an agent
inside the server does by being read directly; an agent says it only of its own pool's tasks."""

from __future__ import annotations

WORDS = (
    "the scheduler may have queued the job: Unable to contact slurm controller (receive "
    "failure); its job may exist: Klique looks for its tag twice, at least 10 s apart, and "
    "submits it again only if neither finds it"
)


def _published(server, token: str, pool: str, unknown: dict[str, str]) -> None:
    report = {"op": "published", "state": {"free_slots": 4, "outcome_unknown": unknown}}
    with server.api(token) as agent:
        answer = agent.post(f"/agent/pools/{pool}/calls", json={"calls": [report]})
        answer.raise_for_status()


def _why(server, alice: str, task_id: int) -> dict:
    with server.api(alice) as api:
        answer = api.get(f"/tasks/{task_id}/why")
        answer.raise_for_status()
        return answer.json()


def test_why_shows_a_remote_pools_unknown_outcome_and_no_other_pools_word(remote_pools):
    server, tokens, ids, alice = remote_pools
    assert _why(server, alice, ids["a"])["primary"] != "outcome-unknown"
    # Pool b's agent speaks of a's task: the control plane reads a's word from a's agent only.
    _published(server, tokens["b"], "b", {str(ids["a"]): "forged"})
    assert _why(server, alice, ids["a"])["primary"] != "outcome-unknown"
    _published(server, tokens["a"], "a", {str(ids["a"]): WORDS})
    why = _why(server, alice, ids["a"])
    assert why["waiting"] and why["primary"] == "outcome-unknown", why
    assert "receive failure" in why["reason"] and "looks for its tag twice" in why["reason"]
    assert "forged" not in str(why)
    # Found, or sent again: the agent's next word says nothing of it, and neither does why.
    _published(server, tokens["a"], "a", {})
    assert _why(server, alice, ids["a"])["primary"] != "outcome-unknown"
