"""Tasks, observations and pool states as JSON, as the agent API carries them between the
control plane and `klique agent`: lossless both ways."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from broker.domain import Origin, Task, TaskState, spec_from_dict, spec_to_dict
from broker.execution import Observation, PoolState

_TASK_FIELDS = {f.name for f in fields(Task)}


def task_to_json(task: Task) -> dict[str, Any]:
    data = {name: getattr(task, name) for name in _TASK_FIELDS if name != "spec"}
    data["spec"] = spec_to_dict(task.spec)
    data["state"] = task.state.value
    data["gpu_ids"] = list(task.gpu_ids)
    data["skip_pools"] = sorted(task.skip_pools)
    return data


def task_from_json(data: dict[str, Any]) -> Task:
    known = {k: v for k, v in data.items() if k in _TASK_FIELDS}
    known["spec"] = spec_from_dict(data["spec"])
    known["state"] = TaskState(data["state"])
    known["gpu_ids"] = tuple(data.get("gpu_ids") or ())
    known["skip_pools"] = frozenset(data.get("skip_pools") or ())
    known["origin"] = Origin(data.get("origin") or Origin.POOL)
    known["packages"] = tuple(data.get("packages") or ())
    known["tags"] = tuple(data.get("tags") or ())
    known["inputs"] = tuple((int(t), str(n)) for t, n in data.get("inputs") or ())
    return Task(**known)


def observation_to_json(seen: Observation) -> dict[str, Any]:
    data = asdict(seen)
    data["state"] = seen.state.value
    return data


def observation_from_json(data: dict[str, Any]) -> Observation:
    known = {k: v for k, v in data.items() if k in Observation.__dataclass_fields__}
    known["state"] = TaskState(data["state"])
    return Observation(**known)


def pool_state_to_json(state: PoolState) -> dict[str, Any]:
    return asdict(state)


def pool_state_from_json(data: dict[str, Any]) -> PoolState:
    known = {k: v for k, v in data.items() if k in PoolState.__dataclass_fields__}
    unknown = known.get("outcome_unknown") or {}  # JSON's keys are strings: the ids again
    known["outcome_unknown"] = {int(task_id): str(why) for task_id, why in unknown.items()}
    return PoolState(**known)
