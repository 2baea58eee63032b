"""Attacks on batches and sweeps: bob (the attacker) tries to make tasks as alice, and to see,
list or cancel alice's sweep; a sweep's values try to reach a shell; a batch of pipeline steps
tries to hang steps under alice's tasks or read her artifacts."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
from conftest import TASK_PY, wait_for

from .conftest import Attack


def test_a_batch_makes_tasks_only_for_the_caller(attack_factory) -> None:
    attack: Attack = attack_factory("host")
    who = {"command": ["id", "-un"], "resource": "cpu"}
    with attack.server.api(attack.bob) as api:
        as_alice = api.post("/tasks/batch", json={"tasks": [dict(who, owner="alice")]})
        outer = api.post("/sweeps", json={"tasks": [who], "owner": "alice"})
        made = api.post("/sweeps", json={"tasks": [who, who]})
    assert as_alice.status_code == 422 and outer.status_code == 422
    assert made.status_code == 201, made.text
    for task in made.json()["tasks"]:
        assert task["owner"] == "bob"
        assert attack.server.wait_state(task["id"], token=attack.bob)["state"] == "completed"
        logs = attack.server.cli("logs", str(task["id"]), token=attack.bob).output
        assert logs == "bob\n"  # it ran as bob's own account
    with attack.server.api(attack.alice) as api:
        assert api.get("/tasks").json() == []


def test_another_users_sweep_cannot_be_seen_listed_or_cancelled(attack_factory) -> None:
    attack: Attack = attack_factory("host")
    server = attack.server
    sleeper = {"command": [TASK_PY, "-c", "import time; time.sleep(300)"], "resource": "cpu"}
    with server.api(attack.alice) as api:
        made = api.post("/sweeps", json={"name": "alice's", "tasks": [sleeper] * 2}).json()
    sweep, ids = made["sweep"], [t["id"] for t in made["tasks"]]
    wait_for(
        lambda: {server.task(i, attack.alice)["state"] for i in ids} == {"running"},
        60,
        "alice's sweep to run",
    )
    with server.api(attack.bob) as api:
        answers = [
            api.get(f"/sweeps/{sweep}"),
            api.get(f"/sweeps/{sweep}/tasks"),
            api.post(f"/sweeps/{sweep}/cancel"),
        ]
        nothing = api.get(f"/sweeps/{sweep + 1000}")
    for answer in answers:
        assert answer.status_code == 404
        # The same answer as for a sweep that does not exist: nothing tells bob it is there.
        assert answer.json()["detail"] == nothing.json()["detail"].replace(
            str(sweep + 1000), str(sweep)
        )
    refused = server.cli("cancel", "--sweep", str(sweep), token=attack.bob)
    assert refused.exit_code != 0 and f"no sweep {sweep} of yours" in refused.output
    assert {server.task(i, attack.alice)["state"] for i in ids} == {"running"}
    assert server.cli("cancel", "--sweep", str(sweep), token=attack.alice).exit_code == 0
    for task_id in ids:
        assert server.wait_state(task_id, token=attack.alice)["state"] == "cancelled"


def test_a_sweeps_values_are_arguments_never_shell_words(attack_factory, tmp_path) -> None:
    attack: Attack = attack_factory("host")
    marker = Path(f"/tmp/klique-pwned-{uuid.uuid4().hex}")
    values = [f"$(touch {marker})", f"; touch {marker}", f"`touch {marker}`", "{x}"]
    params = tmp_path / "params.jsonl"
    params.write_text("".join(json.dumps({"v": v}) + "\n" for v in values))
    printer = "import sys; print(repr(sys.argv[1]))"
    result = attack.server.cli(
        "submit", "--no-code", "--json", "--sweep", str(params), "--",
        TASK_PY, "-c", printer, "{v}",
        token=attack.bob,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for task, value in zip(json.loads(result.output)["tasks"], values, strict=True):
        assert attack.server.wait_state(task["id"], token=attack.bob)["state"] == "completed"
        logs = attack.server.cli("logs", str(task["id"]), token=attack.bob).output
        assert logs == repr(value) + "\n"
    assert not marker.exists()


def test_a_batch_of_steps_goes_only_under_the_callers_own_task(attack_factory) -> None:
    attack: Attack = attack_factory("host")
    server = attack.server
    with server.api(attack.alice) as alice:
        local = {"command": ["python3", "train.py"], "name": "alice's run"}
        alices = alice.post("/sdk/tasks", json=local).json()["id"]
    sleeper = {"command": [TASK_PY, "-c", "import time; time.sleep(600)"], "resource": "cpu"}
    with server.api(attack.bob) as bob:
        bobs = bob.post("/tasks", json=sleeper).json()["id"]
    bob_task = server.wait_state(bobs, {"running"}, token=attack.bob)
    # bob's job reads its own report token from its task.json, as any job can.
    token = json.loads((Path(bob_task["job_dir"]) / "task.json").read_text())["report"]["token"]
    step = {"command": ["true"], "resource": "cpu"}
    theirs = {"task": alices, "name": "model"}
    with httpx.Client(
        base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}
    ) as job:
        under_alice = job.post(
            "/sdk/tasks/batch", json={"tasks": [step, {**step, "parent": alices}]}
        )
        reading = job.post("/sdk/tasks/batch", json={"tasks": [{**step, "inputs": [theirs]}]})
        assert under_alice.status_code == 404 and "tasks[1]" in under_alice.json()["detail"]
        assert reading.status_code == 404 and "tasks[0]" in reading.json()["detail"]
        assert job.get(f"/sdk/tasks/{bobs}/steps").json() == []  # all or none: none
        made = job.post("/sdk/tasks/batch", json={"tasks": [step, step]})
        assert made.status_code == 201, made.text
        assert {(t["owner"], t["parent"]) for t in made.json()} == {("bob", bobs)}
    with server.api(attack.bob) as bob:
        as_user = bob.post("/sdk/tasks/batch", json={"tasks": [{**step, "parent": alices}]})
        assert as_user.status_code == 404 and "tasks[0]" in as_user.json()["detail"]
    with server.api(attack.alice) as alice:
        assert [t["id"] for t in alice.get("/tasks").json()] == [alices]
    server.cli("cancel", str(bobs), token=attack.bob)
