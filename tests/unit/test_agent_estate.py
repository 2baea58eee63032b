"""One pool's part of the estate, as its agent reads it (broker/agents/estate_view.py), and the
words of a refused agent token (broker/api/agent_tokens.py)."""

from __future__ import annotations

import time

import pytest

from broker.agents.estate_view import agent_estate
from broker.api.agent_tokens import refusal
from broker.errors import NotFound
from broker.estate import parse_estate
from broker.store.rows import AgentTokenInfo

ESTATE = """
templates_dir: site-templates
defaults: {resource: gpu}
limits: {max_batch: 50}
resources:
  cpu:
    profile: {cpus: 2, memory: 1G, walltime: 2h, pools: [hpc, other]}
    extra_directives: ["--qos=normal"]
    checkpoint_signal: {signal: USR2, before: 5m}
  gpu: {profile: {gpus: 1, walltime: 1h, pools: [other]}}
  idle: {profile: {cpus: 1, pools: [unused]}}
pools:
  hpc:
    kind: slurm
    agent: remote
    partition: batch
    job_root: /shared/jobs
    poll_interval: 5s
    user_map: {alice: alice, default: guest}
  other: {kind: slurm, agent: remote, partition: gpu, job_root: /other, user_map: {bob: bob}}
  unused: {kind: slurm, agent: remote, partition: x, job_root: /x}
"""


def test_the_agents_estate_builds_the_same_pool_and_resources_and_nothing_else() -> None:
    whole = parse_estate(ESTATE, "estate.yaml")
    mine = parse_estate(agent_estate(whole, "hpc"), "agent view")
    assert list(mine.pools) == ["hpc"]
    assert mine.pools["hpc"] == whole.pools["hpc"]  # settings, units and user map as on the server
    assert list(mine.resources) == ["cpu"]
    cpu, whole_cpu = mine.resources["cpu"], whole.resources["cpu"]
    assert cpu.profile.pools == ("hpc",)
    assert (cpu.profile.memory_mb, cpu.profile.walltime_s) == (1024, 7200)
    assert cpu.extra_directives == whole_cpu.extra_directives
    assert cpu.checkpoint_signal == whole_cpu.checkpoint_signal
    assert mine.templates_dir == "site-templates"
    assert mine.limits.max_batch != 50 and mine.default_resource == "cpu"  # not the server's


def test_a_pool_no_compute_resource_names_has_no_agent_estate() -> None:
    whole = parse_estate(ESTATE.replace("pools: [unused]", "pools: [other]"), "estate.yaml")
    with pytest.raises(NotFound, match="no compute resource names pool 'unused'"):
        agent_estate(whole, "unused")


def test_a_refused_agent_token_is_told_how_to_get_a_new_one() -> None:
    now = time.time()
    token = AgentTokenInfo("agent-0123456789abcdef", ("a", "b"), now + 60, False, None, now)
    assert refusal(token, now) is None
    new = "klique token create-agent --pool a --pool b"
    expired = refusal(token, now + 61)
    assert expired is not None and "expired at" in expired and new in expired
    revoked = refusal(AgentTokenInfo(**{**token.__dict__, "revoked": True}), now)
    assert revoked is not None and "was revoked" in revoked and new in revoked
    unknown = refusal(None, now)
    assert unknown is not None and "klique token create-agent --pool POOL" in unknown
