"""The agent API's task list, encoded once per version of each task, reads as the plain
encoding would, and follows every change."""

from __future__ import annotations

import json
from dataclasses import replace

from fastapi.encoders import jsonable_encoder

from broker.agents.wire import task_to_json
from broker.api.agent_tasks import EncodedTasks
from broker.domain import Origin, TaskState
from broker.estate import parse_estate
from broker.preview import sample_task

ESTATE = """
resources:
  r: {profile: {pools: [p], cpus: 1, walltime: 5s}}
pools:
  p: {kind: host, slots: 1}
"""


def tasks() -> list:
    first = replace(
        sample_task(parse_estate(ESTATE), "r", "alice"),
        id=7,
        state=TaskState.RUNNING,
        origin=Origin.CACHED,
        parameters={"lr": 0.1, "name": 'é \u2028 "quoted"'},
        gpu_ids=(0, 1),
        skip_pools=frozenset({"q"}),
    )
    return [first, replace(first, id=8, state=TaskState.PENDING, intent="cancel")]


def test_the_body_reads_as_the_plain_encoding() -> None:
    held = tasks()
    body = json.loads(EncodedTasks().body("p", held))
    assert body == jsonable_encoder([task_to_json(t) for t in held])


def test_a_changed_task_is_sent_changed_and_a_task_gone_is_not_sent() -> None:
    encoded = EncodedTasks()
    first, second = tasks()
    encoded.body("p", [first, second])
    changed = replace(first, state=TaskState.COMPLETED)
    body = json.loads(encoded.body("p", [changed]))
    assert [(t["id"], t["state"]) for t in body] == [(7, "completed")]
    assert json.loads(encoded.body("p", [])) == []
    assert json.loads(encoded.body("other", [second]))[0]["id"] == 8
