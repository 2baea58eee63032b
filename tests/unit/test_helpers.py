"""The tests' shared helpers on plain data: an estate built of Python values is the estate its
hand-written file gives, and squeue's lines read into the jobs the helpers compare."""

from __future__ import annotations

import dataclasses

import yaml
from helpers.estates import estate, estate_yaml, profile
from helpers.slurm import SlurmJob, parse_squeue_line

from broker.estate import parse_estate

WRITTEN = """
teams: {vision: [alice]}
resources:
  1-gpu: {profile: {gpus: 1, cpus: 2, memory: 1G, walltime: 1h, pools: [box, hpc]}}
pools:
  box: {kind: host, slots: 2, gpus: 1}
  hpc: {kind: slurm, job_root: /jobs, user_map: {alice: alice}}
policies:
  vision: {resources: [1-gpu]}
"""


def test_an_estate_of_python_values_is_the_one_its_file_gives() -> None:
    built = estate(
        policies={"vision": {"resources": ("1-gpu",)}},
        pools={
            "box": {"kind": "host", "slots": 2, "gpus": 1},
            "hpc": {"kind": "slurm", "job_root": "/jobs", "user_map": {"alice": "alice"}},
        },
        resources={"1-gpu": profile("box", "hpc", gpus=1, cpus=2, memory="1G", walltime="1h")},
        teams={"vision": ["alice"]},
    )
    written = parse_estate(WRITTEN, "estate.yaml")
    assert dataclasses.replace(built, text="") == dataclasses.replace(written, text="")


def test_sections_come_in_the_files_order_and_none_is_left_out() -> None:
    text = estate_yaml(pools={"p": {"kind": "host"}}, server=None, teams={}, mail_domain="a.org")
    assert list(yaml.safe_load(text)) == ["teams", "pools", "mail_domain"]
    assert "server" not in text


def test_squeue_lines_read_into_jobs_and_array_elements() -> None:
    assert parse_squeue_line("21|klique-7|PENDING|/jobs/klique-7-1-ab/job.sh\n") == SlurmJob(
        21, "klique-7", "PENDING", None, "/jobs/klique-7-1-ab/job.sh"
    )
    element = parse_squeue_line("30_2|klique-array-5-x|RUNNING|/jobs/a/job.sh")
    assert element is not None and element.native_id == "30_2" and element.index == 2


def test_an_array_still_pending_whole_or_a_stray_line_is_no_job() -> None:
    assert parse_squeue_line("30_[3-9]|klique-array-5-x|PENDING|/jobs/a/job.sh") is None
    assert parse_squeue_line("squeue: error: Invalid user") is None
    assert parse_squeue_line("") is None
