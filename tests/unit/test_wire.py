"""Tasks cross the agent API (`klique agent` on a login node) as JSON and come back equal."""

from __future__ import annotations

import json
from dataclasses import replace

from broker.agents.wire import task_from_json, task_to_json
from broker.domain import Origin, TaskState
from broker.estate import parse_estate
from broker.preview import sample_task

ESTATE = """
resources:
  r: {profile: {pools: [p], cpus: 1, walltime: 5s}}
pools:
  p: {kind: host, slots: 1}
"""


def test_a_task_with_the_sdks_record_comes_back_equal() -> None:
    task = replace(
        sample_task(parse_estate(ESTATE), "r", "alice"),
        id=7,
        state=TaskState.RUNNING,
        origin=Origin.CACHED,
        parent=3,
        parameters={"lr": 0.1, "layers": [1, 2]},
        packages=("numpy==2.0.0",),
        inputs=((3, "model"), (4, "data")),
        cache_key="a" * 64,
        gpu_ids=(0, 1),
        skip_pools=frozenset({"q"}),
    )
    assert task_from_json(json.loads(json.dumps(task_to_json(task)))) == task
