"""A job's report is a claim, not a fact: only the pool ends a task. A task that reports its
own end while it runs on keeps running, metered and holding its capacity; a report token
opens one task only; unknown tasks and wrong tokens get the same answer."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import httpx
import pytest
from conftest import wait_for

from .conftest import SLURM, Attack, submit

# The task claims, over HTTP and in its exit file, that it completed; then it runs on.
FALSE_CLAIM = """
import json, os, urllib.request
job = os.environ["KLIQUE_JOB_DIR"]
spec = json.load(open(job + "/task.json"))
claim = {"exit_code": 0, "outcome": "completed", "reason": "done (not really)"}
request = urllib.request.Request(
    spec["report"]["url"] + "/api/v1/tasks/%s/report" % spec["id"],
    data=json.dumps({"exit": claim}).encode(), method="POST",
    headers={"Content-Type": "application/json",
             "Authorization": "Bearer " + spec["report"]["token"]})
print("report answered", urllib.request.urlopen(request).status, flush=True)
json.dump(claim, open(job + "/exit.json", "w"))
"""


@pytest.mark.parametrize("pool", ["host", SLURM])
def test_a_false_completed_report_leaves_the_task_running_and_metered(
    attack_factory, pool: str
) -> None:
    attack: Attack = attack_factory(pool, **({"slots": 1} if pool == "host" else {}))
    script = f"python3 -c {shlex.quote(FALSE_CLAIM)} && sleep 600"
    task_id = submit(attack, attack.bob, script)
    server = attack.server
    server.wait_state(task_id, {"running"}, token=attack.bob)

    def claimed() -> dict | None:
        task = server.task(task_id, attack.bob)
        return task if task["claim"] else None

    task = wait_for(claimed, 60, "the claim to be recorded")
    logs = server.cli("logs", str(task_id), token=attack.bob).output
    assert task["claim"]["outcome"] == "completed" and task["state"] == "running", (task, logs)
    if pool == "host":  # the host pool reads the forged exit file beside a live runner
        task = wait_for(
            lambda: (t := server.task(task_id, attack.bob))["reason"] and t, 30, "the verdict"
        )
        assert "the report is ignored until the process ends" in task["reason"], task
        waiting = submit(attack, attack.bob, "true")  # its one slot is still taken
        why = wait_for(
            lambda: (
                (
                    w := json.loads(
                        server.cli("why", str(waiting), "--json", token=attack.bob).output
                    )
                )["waiting"]
                and w
            ),
            30,
            "the second task to wait",
        )
        assert why["primary"] == "no-capacity", why
    assert server.task(task_id, attack.bob)["state"] == "running"
    usage = json.loads(server.cli("usage", "--by", "user", "--json", token=attack.bob).output)
    assert usage["rows"][0]["ongoing"] == 1  # still metered
    assert server.cli("cancel", str(task_id), token=attack.bob).exit_code == 0
    assert server.wait_state(task_id, token=attack.bob)["state"] == "cancelled"


def test_a_report_token_opens_its_own_task_only(attack_factory) -> None:
    attack: Attack = attack_factory("host")
    server = attack.server
    alices = submit(attack, attack.alice, "sleep 600")
    bobs = submit(attack, attack.bob, "sleep 600")
    server.wait_state(alices, {"running"}, token=attack.alice)
    bob_task = server.wait_state(bobs, {"running"}, token=attack.bob)
    # bob reads his own token from his own task.json, as his job can.
    token = json.loads((Path(bob_task["job_dir"]) / "task.json").read_text())["report"]["token"]
    claim = {"exit": {"exit_code": 0, "outcome": "completed"}}
    with httpx.Client(base_url=server.url + "/api/v1") as api:
        headers = {"Authorization": f"Bearer {token}"}
        on_alices = api.post(f"/tasks/{alices}/report", json=claim, headers=headers)
        on_nothing = api.post("/tasks/999999/report", json=claim, headers=headers)
        on_his_own = api.post(f"/tasks/{bobs}/report", json={"scalars": []}, headers=headers)
    assert on_alices.status_code == 401
    assert (on_nothing.status_code, on_nothing.json()) == (401, on_alices.json())
    assert on_his_own.status_code == 200
    assert server.task(alices, attack.alice)["claim"] is None
    assert server.task(alices, attack.alice)["state"] == "running"
    for task_id, token in ((alices, attack.alice), (bobs, attack.bob)):
        server.cli("cancel", str(task_id), token=token)
