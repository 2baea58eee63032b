"""The dry run on plain data: verdicts per task, summaries per team, traces in and out."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from helpers import estates
from helpers.estates import profile

from broker.domain import Estate
from broker.errors import KliqueError
from broker.execution import PoolState
from broker.scheduler.placement import ActiveTask, PendingCode, QueuedTask
from broker.scheduler.simulate import parse_trace, simulate


def sections(
    gpus: int = 1,
    order: tuple[str, ...] = ("box",),
    max_queued: int = 10,
    vision: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A host pool `box` and a Slurm pool `hpc`; one compute resource on `order`; two teams,
    each with a policy (vision's with more settings given as `vision`)."""
    return {
        "defaults": {"min_run": "0s", "reclaim_grace": "0s"},
        "teams": {"vision": ["alice"], "nlp": ["bob"]},
        "resources": {"1-gpu": profile(*order, gpus=1, cpus=1, memory="1G", walltime="1h")},
        "pools": {
            "box": {"kind": "host", "slots": 8, "gpus": gpus},
            "hpc": {"kind": "slurm", "job_root": "/tmp/jobs", "max_queued": max_queued},
        },
        "policies": {
            "vision": {"resources": ["1-gpu"], **(vision or {})},
            "nlp": {"resources": ["1-gpu"]},
        },
    }


def estate(**changes: Any) -> Estate:
    return estates.estate("new.yaml", **sections(**changes))


def q(task_id: int, owner: str = "alice", team: str | None = "vision") -> QueuedTask:
    return QueuedTask(task_id, owner, team, "1-gpu", float(task_id))


STATES = {"box": PoolState("box"), "hpc": PoolState("hpc", free_gpus=0.0)}


def test_more_gpus_let_every_queued_task_start() -> None:
    queue = [q(1), q(2), q(3, "bob", "nlp")]
    before = simulate(estate(gpus=1), queue, [], STATES, now=10.0)
    after = simulate(estate(gpus=4), queue, [], STATES, now=10.0)
    assert [v.pool for v in before.verdicts] == ["box", None, None]
    assert [v.sentence for v in after.verdicts] == ["would start on box"] * 3
    waiting = before.verdicts[1]
    assert waiting.waiting is not None and waiting.waiting.primary is PendingCode.NO_CAPACITY
    assert waiting.sentence.startswith("would wait: no pool in the profile can start it now")


def test_a_second_pool_in_the_order_takes_the_overflow_up_to_max_queued() -> None:
    queue = [q(i) for i in range(1, 6)]
    result = simulate(
        estate(gpus=1, order=("box", "hpc"), max_queued=2), queue, [], STATES, now=9.0
    )
    assert [v.pool for v in result.verdicts] == ["box", "hpc", "hpc", None, None]
    (team,) = result.teams
    assert (team.team, team.tasks, team.start, team.wait) == ("vision", 5, 3, 2)
    assert team.pools == {"box": 1, "hpc": 2} and team.reasons == {"no-capacity": 2}


def test_a_team_the_new_policy_leaves_out_would_wait_not_permitted() -> None:
    vision_only = {**sections(gpus=4), "policies": {"vision": {"resources": ["1-gpu"]}}}
    new = estates.estate("new.yaml", **vision_only)
    result = simulate(new, [q(1), q(2, "bob", "nlp")], [], STATES, now=5.0)
    verdict = {v.id: v for v in result.verdicts}
    assert verdict[1].pool == "box"
    assert verdict[2].waiting is not None
    assert verdict[2].waiting.primary is PendingCode.NOT_PERMITTED
    assert "nlp" in verdict[2].sentence
    assert [(t.team, t.wait, t.reasons) for t in result.teams] == [
        ("nlp", 1, {"not-permitted": 1}),
        ("vision", 0, {}),
    ]


def test_a_new_reservation_preempts_a_borrowed_run() -> None:
    borrowed = ActiveTask(7, "bob", "nlp", "1-gpu", "box", True, 0.0, borrowed=True, gpus=(0,))
    new = estate(gpus=1, vision={"reservation": {"1-gpu": 1}})
    result = simulate(new, [q(1)], [borrowed], STATES, now=5000.0)
    assert result.preempted == [7]
    assert result.verdicts[0].pool is None
    assert result.verdicts[0].waiting is not None
    assert result.verdicts[0].waiting.primary is PendingCode.RECLAIM


def test_a_pool_with_no_recorded_state_is_assumed_reachable() -> None:
    result = simulate(estate(gpus=2), [q(1)], [], {}, now=1.0)
    assert result.assumed == ["box", "hpc"]
    assert result.verdicts[0].pool == "box"


def test_active_tasks_take_their_room_first() -> None:
    running = ActiveTask(9, "alice", "vision", "1-gpu", "box", True, 0.0, gpus=(0,))
    result = simulate(estate(gpus=1), [q(1)], [running], STATES, now=1.0)
    assert result.verdicts[0].pool is None
    assert result.to_dict()["tasks"][0]["pools"]["box"].startswith("needs 1 GPU, 0 free")


def test_to_dict_is_json_with_one_entry_per_task_and_team() -> None:
    result = simulate(estate(gpus=1), [q(2), q(1)], [], STATES, now=3.0)
    doc = json.loads(json.dumps(result.to_dict()))
    assert [t["id"] for t in doc["tasks"]] == [1, 2]
    assert [t["outcome"] for t in doc["tasks"]] == ["start", "wait"]
    assert doc["tasks"][1]["reason"] == "no-capacity"
    assert doc["teams"][0]["team"] == "vision"


def test_a_bare_list_is_a_queue_and_now_is_its_latest_time() -> None:
    text = json.dumps(
        [
            {"id": 1, "owner": "alice", "team": "vision", "resource": "1-gpu", "queued_at": 5},
            {"id": 2, "owner": "bob", "team": "nlp", "resource": "1-gpu", "queued_at": 8.5},
        ]
    )
    trace = parse_trace(text, "t.json")
    assert [t.id for t in trace.queued] == [1, 2] and trace.now == 8.5
    assert trace.active == [] and trace.pools == {}


def test_a_trace_round_trips_through_its_json() -> None:
    trace = parse_trace(
        json.dumps(
            {
                "now": 100.0,
                "queued": [
                    {
                        "id": 3,
                        "owner": "alice",
                        "resource": "1-gpu",
                        "queued_at": 50,
                        "skip_pools": ["hpc"],
                    }
                ],
                "active": [
                    {
                        "id": 1,
                        "owner": "bob",
                        "team": "nlp",
                        "resource": "1-gpu",
                        "pool": "box",
                        "since": 10,
                        "gpus": [0],
                    }
                ],
                "pools": [{"name": "hpc", "free_gpus": 2, "queued": 1}],
                "usage": {"nlp": 30.0},
            }
        )
    )
    again = parse_trace(json.dumps(trace.to_dict()))
    assert again == trace
    assert trace.queued[0].skip_pools == frozenset({"hpc"}) and trace.queued[0].team is None
    assert trace.pools["hpc"].free_gpus == 2.0 and trace.active[0].running


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "t.json: not valid JSON"),
        ('[{"id": 1, "resource": "1-gpu", "queued_at": 1}]', "queued.0.owner: Field required"),
        ('{"queued": [], "pools": [{"name": "x", "free": 1}]}', "pools.0.free"),
    ],
)
def test_a_bad_trace_names_the_file_and_the_entry(text: str, words: str) -> None:
    with pytest.raises(KliqueError, match="t.json") as caught:
        parse_trace(text, "t.json")
    assert words in str(caught.value) and "fix:" in str(caught.value)
