"""An agent token acts for its own pools' tasks only, also when it reports a batch: in a batch
of attempts, accepted jobs or observations, a call naming a task of another pool (or none) acts
on nothing and is answered as for a task that moved on, while the pool's own calls stand.
It ends: at its expiry, or at once when revoked; admins list agent tokens without their secrets;
and it reads its own pool's part of the estate alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from conftest import HOST_ACCESS, ROOT, wait_for

from broker.estate import parse_estate
from broker.pools.settings import serves_remotely

from .conftest import REMOTE_POOLS


def calls(op: str, *task_ids: int) -> dict[str, Any]:
    fields = {
        "begin": {"job_dir": "/jobs/x"},
        "submitted": {"native_id": "7"},
        "observed": {"observation": {"state": "running", "reason": "R"}},
    }[op]
    return {"calls": [{"op": op, "task_id": i, **fields} for i in task_ids]}


def test_a_batch_naming_another_pools_task_acts_only_on_its_own(remote_pools) -> None:
    server, tokens, ids, _alice = remote_pools
    missing = max(ids.values()) + 1000
    with server.api(tokens["a"]) as agent:
        for op, no in (("begin", None), ("submitted", False)):
            foreign = agent.post("/agent/pools/a/calls", json=calls(op, ids["b"]))
            unknown = agent.post("/agent/pools/a/calls", json=calls(op, missing))
            # Another pool's task and one that does not exist: the same answer, no oracle of ids.
            assert foreign.status_code == unknown.status_code == 200, foreign.text
            assert foreign.json() == unknown.json() == {"results": [no]}
        other = agent.post("/agent/pools/b/calls", json=calls("begin", ids["b"]))
        assert other.status_code == 403 and "does not serve pool 'b'" in other.text
    for task_id in ids.values():  # nothing was recorded for any task
        task = server.task(task_id)
        assert (task["state"], task["job_dir"], task["native_id"]) == ("placed", None, None)
    # The pool's own task in the same batches is recorded; the other pool's is not.
    with server.api(tokens["a"]) as agent:
        begun = agent.post("/agent/pools/a/calls", json=calls("begin", ids["a"], ids["b"]))
        first, second = begun.json()["results"]
        assert first["job_dir"] == "/jobs/x" and second is None
        accepted = agent.post("/agent/pools/a/calls", json=calls("submitted", ids["a"], ids["b"]))
        assert accepted.json() == {"results": [True, False]}
    task = server.task(ids["a"])
    assert (task["state"], task["native_id"]) == ("submitted", "7")
    # A look's observations: the other pool's task is left as it is.
    with server.api(tokens["a"]) as agent:
        seen = agent.post("/agent/pools/a/calls", json=calls("observed", ids["a"], ids["b"]))
        assert seen.json() == {"results": [None, None]}
    assert server.task(ids["a"])["state"] == "running"
    b = server.task(ids["b"])
    assert (b["state"], b["job_dir"], b["native_id"]) == ("placed", None, None)


# Two remote pools of two clusters, and what only the control plane may know: teams, policies,
# identity settings. Pool alpha's agent must read nothing of other-cluster's or of these.
NARROW = f"""
mail_domain: example.org
teams:
  secret-team: [alice, bob, admin]
policies:
  secret-team: {{resources: [cpu-a, shared, other-gpu], priority: 7}}
identity:
  groups: {{hpc-vision-grp: secret-team}}
  admin_groups: [klique-admins-grp]
resources:
  cpu-a: {{profile: {{cpus: 1, memory: 200M, walltime: 10m, pools: [alpha]}}}}
  shared: {{profile: {{cpus: 1, memory: 200M, walltime: 10m, pools: [alpha, other-cluster]}}}}
  other-gpu: {{profile: {{gpus: 1, walltime: 10m, pools: [other-cluster]}}}}
pools:
  alpha:
    kind: host
    agent: remote
    {HOST_ACCESS}
  other-cluster:
    kind: slurm
    agent: remote
    partition: hidden-partition
    job_root: /lustre/other-jobs
    transport: {{kind: ssh, host: login-b.example.org, known_hosts: /etc/ssh/ssh_known_hosts}}
    user_map: {{alice: alice, zed-only-b: bob}}
"""


def agent_token(server: Any, *pools: str, **fields: Any) -> dict[str, Any]:
    with server.api() as api:
        made = api.post("/agent-tokens", json={"pools": list(pools), **fields})
    assert made.status_code == 201, made.text
    return dict(made.json())


def test_an_expired_agent_token_is_refused_with_the_way_to_a_new_one(server_factory) -> None:
    server = server_factory(REMOTE_POOLS)
    lasting = agent_token(server, "a")["token"]
    brief = agent_token(server, "a", expires_in=1)["token"]
    refused: dict[str, Any] = {}

    def ended() -> bool:
        with server.api(brief) as agent:
            answer = agent.get("/agent/pools/a")
        refused.update(status=answer.status_code, detail=answer.json().get("detail"))
        return answer.status_code != 200

    wait_for(ended, 15, "the one-second agent token to be refused")
    assert refused["status"] == 401, refused
    assert "expired" in refused["detail"], refused
    assert "klique token create-agent --pool a" in refused["detail"], refused
    with server.api(lasting) as agent:  # the control: a token in force is served
        assert agent.get("/agent/pools/a").status_code == 200
    with server.api() as api:  # a token cannot be made to outlive a year
        forever = api.post("/agent-tokens", json={"pools": ["a"], "expires_in": 10**9})
        assert forever.status_code == 422, forever.text


def test_a_revoked_agent_token_is_refused_at_once(server_factory) -> None:
    server = server_factory(REMOTE_POOLS)
    made = agent_token(server, "a")
    with server.api(made["token"]) as agent:
        assert agent.get("/agent/pools/a").status_code == 200
        revoked = server.cli("token", "revoke", made["id"])
        assert revoked.exit_code == 0, revoked.output
        assert f"agent token {made['id']} of pools a revoked" in revoked.output
        refused = agent.get("/agent/pools/a")  # the very next call
        assert refused.status_code == 401, refused.text
        detail = refused.json()["detail"]
        assert "revoked" in detail and "klique token create-agent --pool a" in detail, detail
        report = {"calls": [{"op": "published", "state": {"free_slots": 1}}]}
        assert agent.post("/agent/pools/a/calls", json=report).status_code == 401
    # Only an admin revokes agent tokens.
    alice = server.make_token("alice")
    other = agent_token(server, "b")
    with server.api(alice) as api:
        assert api.post(f"/agent-tokens/{other['id']}/revoke").status_code == 403
    with server.api(other["token"]) as agent:
        assert agent.get("/agent/pools/b").status_code == 200


def test_token_ls_lists_agent_tokens_with_pools_and_expiry_and_no_secret(server_factory) -> None:
    server = server_factory(REMOTE_POOLS)
    made = server.cli("token", "create-agent", "--pool", "a", "--pool", "b", "--expires", "30d")
    assert made.exit_code == 0, made.output
    secret = made.output.strip()
    now = time.time()
    listed = server.cli("token", "ls", "--json")
    assert listed.exit_code == 0, listed.output
    assert secret not in listed.output
    [row] = [r for r in json.loads(listed.output) if r["kind"] == "agent"]
    assert row["pools"] == ["a", "b"] and not row["revoked"], row
    assert abs(row["expires_at"] - (now + 30 * 86400)) < 600, row
    assert row["id"].startswith("agent-") and "token" not in row and "digest" not in row, row
    table = server.cli("token", "ls")
    assert row["id"] in table.output and "a,b" in table.output, table.output
    # A user sees their own tokens, and no agent's; the agent API's listing is for admins.
    alice = server.make_token("alice")
    own = json.loads(server.cli("token", "ls", "--json", token=alice).output)
    assert own and all(r["kind"] != "agent" for r in own), own
    with server.api(alice) as api:
        assert api.get("/agent-tokens").status_code == 403


def test_an_agent_reads_its_own_pools_part_of_the_estate_alone(server_factory) -> None:
    server = server_factory(NARROW)
    token = agent_token(server, "alpha")["token"]
    with server.api(token) as agent:
        answer = agent.get("/agent/pools/alpha")
    assert answer.status_code == 200, answer.text
    text = answer.json()["estate"]
    for other in ("other-cluster", "login-b.example.org", "hidden-partition", "zed-only-b"):
        assert other not in text, (other, text)
    for control_plane in ("secret-team", "hpc-vision-grp", "klique-admins-grp", "priority"):
        assert control_plane not in text, (control_plane, text)
    for section in ("teams", "policies", "identity", "other-gpu"):
        assert section not in text, (section, text)
    assert set(answer.json()) == {"pool", "estate"}  # not the server's estate file path either
    # What the agent builds its driver from is all there, and a valid estate.
    estate = parse_estate(text, "agent view")
    assert list(estate.pools) == ["alpha"] and serves_remotely(estate.pools["alpha"])
    assert estate.pools["alpha"].user_map.accounts == {
        "admin": "alice",
        "alice": "alice",
        "bob": "bob",
    }
    assert sorted(estate.resources) == ["cpu-a", "shared"]
    assert estate.resources["shared"].profile.pools == ("alpha",)
    assert estate.mail_domain == "example.org"


def test_klique_agent_runs_its_pools_tasks_from_its_part_and_stops_once_revoked(
    server_factory, tmp_path
) -> None:
    """End to end: `klique agent` builds its driver from the narrowed estate and runs alice's
    task; after a revocation a new start exits at once, saying how to get a new token."""
    server = server_factory(NARROW)
    made = agent_token(server, "alpha")
    token_file = tmp_path / "agent.token"
    token_file.write_text(made["token"])
    token_file.chmod(0o600)
    argv = [sys.executable, "-m", "broker", "agent", "--pool", "alpha", "--server", server.url]
    argv += ["--token-file", str(token_file)]
    env = {**os.environ, "KLIQUE_HOME": str(tmp_path / "agent-home")}
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        agent = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        alice = server.make_token("alice")
        with server.api(alice) as api:
            made_task = api.post("/tasks", json={"command": ["id", "-un"], "resource": "cpu-a"})
        assert made_task.status_code == 201, made_task.text
        task = server.wait_state(made_task.json()["id"], token=alice, timeout=120)
        assert task["state"] == "completed", (task, log.read_text())
    finally:
        agent.terminate()
        agent.wait(30)
    assert server.cli("token", "revoke", made["id"]).exit_code == 0
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert again.returncode != 0, again
    assert (
        "was revoked" in again.stderr and "klique token create-agent --pool alpha" in again.stderr
    )
