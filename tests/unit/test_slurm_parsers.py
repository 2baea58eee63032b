from pathlib import Path

import pytest

from broker.domain import TaskState
from broker.pools.slurm import SLURM_STATES, parse_sacct, parse_sinfo, parse_squeue

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def test_squeue_shows_every_job_with_its_state_and_reason():
    jobs = {j.native_id: j for j in parse_squeue((DATA / "squeue-mixed.txt").read_text())}
    assert {k: (j.name, j.state, j.reason) for k, j in jobs.items()} == {
        "1": ("klique-101", "RUNNING", "None"),
        "2": ("klique-102", "RUNNING", "None"),
        "3": ("klique-103", "FAILED", "NonZeroExitCode"),
        "4": ("klique-104", "COMPLETED", "None"),
        "5": ("klique-105", "PENDING", "Resources"),
    }


def test_a_cancelled_job_stays_listed_with_states_all():
    jobs = {
        j.native_id: j.state for j in parse_squeue((DATA / "squeue-after-cancel.txt").read_text())
    }
    assert jobs["1"] == "CANCELLED" and SLURM_STATES[jobs["1"]] is TaskState.CANCELLED


def test_sinfo_counts_idle_cpus_and_free_gpus():
    capacity = parse_sinfo((DATA / "sinfo-gpus-used.txt").read_text())
    assert capacity.free_cpus == 15 and capacity.free_gpus == 2


@pytest.mark.parametrize(
    ("line", "free"),
    [
        ("0/16/0/16|gpu:4|gpu:0|", 4),
        ("8/8/0/16|gpu:a100:4(S:0-1)|gpu:a100:3(IDX:0-2)|", 1),
        ("0/16/0/16|(null)|gpu:0|", 0),
    ],
)
def test_sinfo_gres_forms(line, free):
    assert parse_sinfo(line).free_gpus == free


def test_sacct_gives_state_and_exit_code():
    jobs = {j.native_id: j for j in parse_sacct((DATA / "sacct-completion.txt").read_text())}
    assert (jobs["3"].state, jobs["3"].exit_code) == ("FAILED", 3)
    assert (jobs["4"].state, jobs["4"].exit_code) == ("COMPLETED", 0)
    assert jobs["1"].state == "CANCELLED"


def test_sacct_cancelled_by_uid_and_steps():
    text = (
        "7|klique-7|CANCELLED by 1001|0:15\n7.batch|batch|CANCELLED|0:15\n8|klique-8|TIMEOUT|0:0\n"
    )
    jobs = parse_sacct(text)
    assert [(j.native_id, j.state) for j in jobs] == [("7", "CANCELLED"), ("8", "TIMEOUT")]


def test_every_state_in_the_table_is_a_klique_state_and_endings_are_distinct():
    assert SLURM_STATES["TIMEOUT"] is TaskState.TIMEOUT
    assert SLURM_STATES["CANCELLED"] is TaskState.CANCELLED
    assert SLURM_STATES["NODE_FAIL"] is TaskState.LOST
    assert SLURM_STATES["PENDING"] is TaskState.PENDING
    assert SLURM_STATES["COMPLETING"] is TaskState.RUNNING


def test_the_two_accountings_read_the_same_jobs_the_same_way():
    """The same six jobs (exit 0, exit 3, exit 130, SIGKILL, SIGTERM, cancelled) as the
    job-completion file and slurmdbd recorded them: a signal reads 128 + signal under both;
    slurmdbd alone records exit 130 as 2."""

    def read(name: str) -> list[tuple[str, int | None]]:
        return [(j.state, j.exit_code) for j in parse_sacct((DATA / name).read_text())]

    jobcomp, slurmdbd = read("sacct-completion-exits.txt"), read("sacct-slurmdbd-exits.txt")
    assert jobcomp == [
        ("COMPLETED", 0),
        ("FAILED", 3),
        ("FAILED", 130),
        ("FAILED", 137),
        ("FAILED", 143),
        ("CANCELLED", 0),
    ]
    assert slurmdbd == [*jobcomp[:2], ("FAILED", 2), *jobcomp[3:]]
