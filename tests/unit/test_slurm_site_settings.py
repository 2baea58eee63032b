"""The Slurm pool under a site's settings, against captured and scripted answers: PrivateData
read from `scontrol show config` decides how status sees every job; sbatch's errors decide
whether a task goes again at once or is looked up by its tag first."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import estates
from helpers.estates import batch_estate, profile
from helpers.scripted_transport import Answer, ScriptedTransport
from test_batch_status import running

from broker.domain import TaskState
from broker.errors import KliqueError, SubmitError, SubmitUnknown, TransportError
from broker.pools.base import Context
from broker.pools.settings import settings_as
from broker.pools.slurm import SlurmDriver, SlurmSettings, parse_private_data, status_mode
from broker.preview import sample_task
from broker.transport import Completed

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
PRIVATE = (DATA / "scontrol-config-private-jobs.txt").read_text()
DEFAULT = (DATA / "scontrol-config-default.txt").read_text()


class SubmittingTransport(ScriptedTransport):
    """Also answers the job folder's write-then-submit with `answer`."""

    async def write_files(
        self, folder: str, files: Mapping[str, Any], *, account: str, then: Sequence[str], **_: Any
    ) -> Completed:
        return await self.run(then, account=account)


def slurm_pool(answer: Answer, **settings: Any) -> tuple[SlurmDriver, SubmittingTransport, Any]:
    estate = batch_estate("slurm", **settings)
    context = Context(estate, Path("."), Path(__file__), None)
    transport = SubmittingTransport(answer)
    return SlurmDriver(estate.pools["p"], context, transport), transport, estate


def squeue_hiding_others(config: str) -> Answer:
    """slurmctld with `config`: under PrivateData=jobs squeue shows each account only its own
    jobs and says nothing of the others (exit 0), as Slurm 22.05 does."""
    jobs = {
        "alice": "11|klique-1|RUNNING|None|/jobs/klique-1/job.sh",
        "bob": "12|klique-2|RUNNING|None|/jobs/klique-2/job.sh",
    }
    hides = "jobs" in (parse_private_data(config) or ())

    def answer(argv: list[str], account: str) -> Completed:
        if argv[:3] == ["scontrol", "show", "config"]:
            return Completed(0, config, "")
        if argv[0] == "squeue":
            users = next(a for a in argv if a.startswith("--users=")).split("=")[1].split(",")
            shown = [jobs[u] for u in users if u in jobs and (u == account or not hides)]
            return Completed(0, "\n".join(shown) + "\n", "")
        return Completed(0, "", "")  # sinfo

    return answer


def poll(driver: SlurmDriver, tasks: Sequence[Any]) -> dict[int, Any]:
    return asyncio.run(driver.poll(tasks))


# slurm.conf(5) "PrivateData"; scontrol show config prints the list, or "none".
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PRIVATE, frozenset({"jobs"})),
        (DEFAULT, frozenset()),
        ("PrivateData             = jobs,usage,users\n", frozenset({"jobs", "usage", "users"})),
        ("ClusterName = x\n", None),
    ],
)
def test_private_data_is_read_from_scontrol_show_config(text, expected):
    assert parse_private_data(text) == expected


def test_the_status_mode_follows_private_data_and_a_status_account():
    assert not status_mode(frozenset(), None, "alice").per_account
    assert not status_mode(frozenset({"usage"}), None, "alice").per_account
    assert status_mode(frozenset({"jobs"}), None, "alice").per_account
    privileged = status_mode(frozenset({"jobs"}), "slurmops", "slurmops")
    assert not privileged.per_account and "status_account slurmops" in privileged.note
    assert status_mode(None, None, "alice").per_account  # unknown: the mode that always sees


def test_with_private_data_jobs_every_account_is_asked_once_per_cycle():
    driver, transport, estate = slurm_pool(squeue_hiding_others(PRIVATE))
    tasks = [running(estate, 1, "alice", "11"), running(estate, 2, "bob", "12")]
    for _ in range(3):
        assert poll(driver, tasks) == {}  # both seen running: nothing new, nothing lost
    squeues = [(argv, account) for argv, account in transport.calls if argv[0] == "squeue"]
    assert sorted(account for _, account in squeues) == ["alice", "bob"] * 3 or len(squeues) == 6
    assert all(f"--users={account}" in argv and "--all" in argv for argv, account in squeues)
    configs = [argv for argv, _ in transport.calls if argv[0] == "scontrol"]
    assert len(configs) == 1  # read once
    assert "PrivateData=jobs" in driver.notes[0]


def test_without_private_data_one_squeue_all_sees_every_account():
    driver, transport, estate = slurm_pool(squeue_hiding_others(DEFAULT))
    tasks = [running(estate, 1, "alice", "11"), running(estate, 2, "bob", "12")]
    assert poll(driver, tasks) == {}
    squeues = [(argv, account) for argv, account in transport.calls if argv[0] == "squeue"]
    assert len(squeues) == 1 and "--users=alice,bob" in squeues[0][0]


def test_a_status_account_is_the_one_query_under_private_data():
    def answer(argv: list[str], account: str) -> Completed:
        if argv[0] == "squeue":  # slurmops is an operator: it sees everyone's jobs
            assert account == "slurmops"
            return Completed(0, "11|klique-1|RUNNING|None|\n12|klique-2|PENDING|Priority|\n", "")
        return squeue_hiding_others(PRIVATE)(argv, account)

    driver, transport, estate = slurm_pool(answer, status_account="slurmops")
    tasks = [running(estate, 1, "alice", "11"), running(estate, 2, "bob", "12")]
    assert poll(driver, tasks)[2].state is TaskState.PENDING
    assert [a for argv, a in transport.calls if argv[0] == "squeue"] == ["slurmops"]


# src/common/slurm_errno.c (22.05): what each sbatch failure proves about the job.
SBATCH_FAILURES = [
    # The request may have reached slurmctld; only its reply was lost: look the tag up first.
    ("Socket timed out on send/recv operation", SubmitUnknown),
    ("Zero Bytes were transmitted or received", SubmitUnknown),
    # No connection was made: nothing was queued, the task waits for the pool.
    ("Unable to contact slurm controller (connect failure)", TransportError),
    ("Connection refused", TransportError),
    # slurmctld answered and refused: the pool's words reach the user.
    ("Invalid account or account/partition combination specified", SubmitError),
    ("Requested node configuration is not available", SubmitError),
]


@pytest.mark.parametrize(("words", "raised"), SBATCH_FAILURES)
def test_an_sbatch_failure_is_classified_by_what_it_proves(words, raised):
    message = f"sbatch: error: Batch job submission failed: {words}\n"
    driver, _, estate = slurm_pool(lambda argv, account: Completed(1, "", message))
    task = replace(sample_task(estate, "r", "alice"), id=7, job_dir="/jobs/klique-7-1-ab")
    with pytest.raises(raised) as caught:
        asyncio.run(driver.submit(task, "token"))
    assert caught.type is raised  # SubmitUnknown is not taken for its parent class


def test_a_task_whose_reply_was_lost_is_found_by_its_tag_and_script():
    listing = "21|klique-7|PENDING|Priority|/jobs/klique-7-1-ab/job.sh\n"
    driver, _, estate = slurm_pool(
        lambda argv, account: Completed(0, listing if argv[0] == "squeue" else "", "")
    )
    task = replace(
        sample_task(estate, "r", "alice"),
        id=7,
        state=TaskState.PLACED,
        job_dir="/jobs/klique-7-1-ab",
    )
    seen = poll(driver, [task])[7]
    assert (seen.state, seen.native_id) == (TaskState.SUBMITTED, "21")


def directives_of(settings: Mapping[str, Any], gpus: int = 2) -> list[str]:
    pool = {"kind": "slurm", "job_root": "/jobs", "user_map": {"alice": "alice"}, **settings}
    resources = {"r": profile("p", gpus=gpus, cpus=1, walltime="5s")}
    estate = estates.estate("<estate>", resources=resources, pools={"p": pool})
    driver = SlurmDriver(estate.pools["p"], Context(estate, Path("."), Path(__file__), None))
    task = sample_task(estate, "r", "alice")
    return driver.directives(task, estate.resources["r"].profile, "/jobs/x")


# sbatch(1) 22.05: --gres and --gpus-per-node count GPUs on each node, --gpus for the whole job;
# --requeue / --no-requeue override JobRequeue (slurm.conf(5)) for this job.
@pytest.mark.parametrize(
    ("settings", "gpus", "requeue"),
    [
        ({}, "--gres=gpu:2", "--requeue"),
        ({"gpu_flag": "gpus-per-node"}, "--gpus-per-node=2", "--requeue"),
        ({"gpu_flag": "gpus", "requeue": "klique"}, "--gpus=2", "--no-requeue"),
        ({"requeue": "none"}, "--gres=gpu:2", "--no-requeue"),
    ],
)
def test_gpus_and_requeue_directives_follow_the_pools_settings(settings, gpus, requeue):
    found = directives_of(settings)
    assert gpus in found and requeue in found


def test_requeue_says_who_runs_a_preempted_job_again():
    def preempted_requeue(**settings: Any) -> object:
        pool = {"kind": "slurm", "job_root": "/jobs", "user_map": {"a": "a"}, **settings}
        resources = {"r": profile("p", cpus=1, walltime="5s")}
        estate = estates.estate("<estate>", resources=resources, pools={"p": pool})
        return settings_as(estate.pools["p"], SlurmSettings).requeue_preempted

    assert preempted_requeue(requeue="klique") is True
    assert preempted_requeue(requeue="none") is False
    assert preempted_requeue() is False
    with pytest.raises(KliqueError, match="requeue: none contradicts requeue_preempted"):
        preempted_requeue(requeue="none", requeue_preempted=True)
