"""policy_problems on plain estates: reservations that overfill pools or exceed limits."""

from __future__ import annotations

from helpers.estates import estate_of

from broker.domain import ComputeResource, Estate, Policy, Pool, Profile
from broker.scheduler.policy_check import policy_problems


def estate(*policies: Policy, gpus: int = 8, slurm: bool = False) -> Estate:
    hosts = ("box-a", "box-b")
    order = (*hosts, "hpc") if slurm else hosts
    resources = [
        ComputeResource("1-gpu", Profile(pools=order, gpus=1)),
        ComputeResource("half-gpu", Profile(pools=("box-b",), gpu_fraction=0.5)),
        ComputeResource("8-gpu", Profile(pools=hosts, gpus=8)),
    ]
    pools = [Pool(name, "host", slots=16, gpus=gpus) for name in hosts]
    pools.append(Pool("hpc", "slurm", queueing=True))
    return estate_of(pools, resources, policies)


ALL = ("1-gpu", "half-gpu", "8-gpu")


def test_reservations_that_fit_are_fine() -> None:
    vision = Policy("vision", ALL, reservation={"1-gpu": 8, "half-gpu": 4})
    nlp = Policy("nlp", ALL, reservation={"1-gpu": 6}, limit={"1-gpu": 6})
    assert policy_problems(estate(vision, nlp)) == []


def test_reservations_that_together_overfill_their_pools() -> None:
    vision = Policy("vision", ALL, reservation={"8-gpu": 1, "half-gpu": 8})
    nlp = Policy("nlp", ALL, reservation={"1-gpu": 6})
    problems = policy_problems(estate(vision, nlp))
    assert [path for path, _ in problems] == ["policies.nlp.reservation.1-gpu"]
    message = problems[0][1]
    assert message.startswith("2 of the 6 × 1-gpu reserved here do not fit on its pools")
    assert "beside the reservations of vision" in message and "fix:" in message


def test_a_reservation_on_one_host_can_overfill_it_alone() -> None:
    problems = policy_problems(estate(Policy("vision", ALL, reservation={"half-gpu": 17})))
    assert [path for path, _ in problems] == ["policies.vision.reservation.half-gpu"]


def test_a_queueing_pool_in_the_profile_is_not_counted_against() -> None:
    greedy = Policy("vision", ALL, reservation={"1-gpu": 40})
    assert policy_problems(estate(greedy, slurm=True)) == []
    assert len(policy_problems(estate(greedy))) == 1


def test_a_reservation_above_its_limit() -> None:
    policy = Policy("vision", ALL, reservation={"1-gpu": 4}, limit={"1-gpu": 2})
    assert policy_problems(estate(policy)) == [
        (
            "policies.vision.reservation.1-gpu",
            "reserves 4 × 1-gpu but the limit is 2; fix: lower the reservation or raise the limit",
        )
    ]


def test_amounts_for_unknown_or_unlisted_resources() -> None:
    policy = Policy("vision", ("1-gpu",), reservation={"2-gpu": 1}, limit={"8-gpu": -1})
    problems = dict(policy_problems(estate(policy)))
    assert problems["policies.vision.reservation.2-gpu"].startswith(
        "no compute resource named '2-gpu'"
    )
    assert problems["policies.vision.limit.8-gpu"].startswith(
        "8-gpu is not in the team's resources"
    )
