"""One rule, said once (Profile.whole_gpus): on a batch pool a fraction or an amount of GPU
memory takes one whole GPU. Placement counts what the script asks for, on every batch kind."""

from __future__ import annotations

import re

import pytest

from broker.estate import parse_estate
from broker.preview import render_preview, sample_task
from broker.scheduler.capacity import Need, need_of

POOLS = {
    "slurm": "{kind: slurm, job_root: /scratch, user_map: {alice: alice}}",
    "pbs": "{kind: pbs, job_root: /scratch, user_map: {alice: alice}}",
    "torque": "{kind: pbs, dialect: torque, job_root: /scratch, user_map: {alice: alice}}",
    "lsf": "{kind: lsf, job_root: /scratch, user_map: {alice: alice}}",
}
PROFILES = {
    "quarter": "gpu_fraction: 0.25",
    "memory": "gpu_memory: 20G",
    "two": "gpus: 2",
    "none": "gpus: 0",
}
# How each scheduler's script asks for GPUs.
ASKED = {
    "slurm": r"--gres=gpu:(\d+)",
    "pbs": r"ngpus=(\d+)",
    "torque": r":gpus=(\d+)",
    "lsf": r'-gpu "num=(\d+)',
}


@pytest.mark.parametrize("kind", sorted(POOLS))
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_placement_counts_the_gpus_the_script_asks_for(kind: str, profile: str) -> None:
    estate = parse_estate(
        f"resources:\n  r:\n    profile: {{{PROFILES[profile]}, pools: [p]}}\n"
        f"pools:\n  p: {POOLS[kind]}\n"
    )
    script = render_preview(estate, sample_task(estate, "r", "alice"), None, False).script
    found = re.search(ASKED[kind], script)
    asked = int(found.group(1)) if found else 0
    need = need_of(estate.resources["r"].profile, estate.pools["p"])
    assert isinstance(need, Need)
    assert (need.gpus, need.share) == (asked, 0.0), script
    assert asked == {"quarter": 1, "memory": 1, "two": 2, "none": 0}[profile]
