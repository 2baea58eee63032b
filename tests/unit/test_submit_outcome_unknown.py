"""A submission whose reply was lost: unknown until two looks for its tag, the scheduler's
message timeout apart, both miss it; found by either, it is adopted (never submitted twice)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers.estates import batch_estate
from helpers.sim_cluster import simulated
from test_slurm_site_settings import DEFAULT, SubmittingTransport, slurm_pool

from broker.control.loop import ControlLoop
from broker.domain import TaskSpec, TaskState
from broker.errors import SubmitError, SubmitUnknown, TransportError
from broker.pools import batch
from broker.pools.base import Context
from broker.pools.lsf import LsfDriver
from broker.pools.pbs import PbsDriver
from broker.preview import sample_task
from broker.scheduler.model import PendingCode
from broker.store.repository import Store
from broker.transport import Completed

# What qsub and bsub print when the server's reply is lost (the simulators print the same:
# tests/fakes/_batchsim/common.py): OpenPBS src/cmds/qsub.c with PBSE_PROTOCOL (15031), TORQUE
# qsub_functions.c with the DIS error "End of File", bsub with LSBE_LSLIB and LSE_MSG_SYS.
LOST_REPLY = {
    "pbspro": "qsub: Error (15031) submitting job",
    "torque": "qsub: submit error (End of File)",
    "lsf": "Failed in an LSF library call: Failed in sending/receiving a message: "
    "Connection reset by peer. Job not submitted.",
}

JOB_DIR = "/jobs/klique-7-1-ab"
LISTED = f"21|klique-7|PENDING|Priority|{JOB_DIR}/job.sh\n"


class Clock:
    """The driver's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(batch, "time", SimpleNamespace(monotonic=clock.monotonic, time=time.time))
    return clock


class Slurm:
    """slurmctld as the driver sees it: `scontrol show config` and a squeue listing that the
    test fills in; sbatch answers `sbatch`."""

    def __init__(self, config: str = DEFAULT, sbatch: str = "") -> None:
        self.config = config
        self.listing = ""
        self.sbatch = sbatch
        self.submits = 0

    def __call__(self, argv: list[str], account: str) -> Completed:
        if argv[0] == "scontrol":
            return Completed(0, self.config, "")
        if argv[0] == "squeue":
            return Completed(0, self.listing, "")
        if argv[0] == "sbatch":
            self.submits += 1
            return Completed(1, "", f"sbatch: error: Batch job submission failed: {self.sbatch}\n")
        return Completed(0, "", "")


def placed(estate: Any) -> Any:
    task = replace(sample_task(estate, "r", "alice"), id=7, job_dir=JOB_DIR)
    return replace(task, state=TaskState.PLACED)


def look(driver: Any, task: Any) -> Any:
    """One poll cycle; the task's news, or None."""
    return asyncio.run(driver.poll([task])).get(task.id)


# src/common/slurm_errno.c's texts, as _remap_slurmctld_errno (slurm_protocol_api.c) names a
# failed exchange with slurmctld: what each proves about the job.
LOST_REPLIES = [
    "Unable to contact slurm controller (receive failure)",
    "Connection reset by peer",
    "Incomplete message",
    "Socket timed out on send/recv operation",
    "Zero Bytes were transmitted or received",
]
NOTHING_QUEUED = [
    "Unable to contact slurm controller (connect failure)",
    "Unable to contact slurm controller (send failure)",
    "Connection refused",
]


@pytest.mark.parametrize("words", LOST_REPLIES)
def test_an_sbatch_reply_lost_after_the_request_went_out_is_unknown(words):
    slurm = Slurm(sbatch=words)
    driver, _, estate = slurm_pool(slurm)
    with pytest.raises(SubmitUnknown):
        asyncio.run(driver.submit(placed(estate), "token"))
    assert "looks for its tag twice" in str(driver.outcome_unknown(7))


@pytest.mark.parametrize("words", NOTHING_QUEUED)
def test_an_sbatch_that_never_reached_slurmctld_queued_nothing(words):
    driver, _, estate = slurm_pool(Slurm(sbatch=words))
    with pytest.raises(TransportError) as caught:
        asyncio.run(driver.submit(placed(estate), "token"))
    assert not isinstance(caught.value, SubmitError)
    assert driver.outcome_unknown(7) is None


def test_one_look_that_misses_the_job_does_not_resubmit(clock):
    slurm = Slurm()
    driver, _, estate = slurm_pool(slurm)
    task = placed(estate)
    assert look(driver, task) is None  # the request may still be inside slurmctld
    clock.now += 9.5  # less than MessageTimeout (10 s) after the first look
    assert look(driver, task) is None
    clock.now += 0.5
    seen = look(driver, task)
    assert seen.state is TaskState.QUEUED
    assert "two looks 10 s apart" in seen.reason


def test_a_job_the_second_look_finds_is_adopted(clock):
    slurm = Slurm()
    driver, _, estate = slurm_pool(slurm)
    task = placed(estate)
    assert look(driver, task) is None
    slurmctld_created_it_late = LISTED
    slurm.listing = slurmctld_created_it_late
    clock.now += 10
    seen = look(driver, task)
    assert (seen.state, seen.native_id) == (TaskState.SUBMITTED, "21")
    slurm.listing = ""
    clock.now += 60  # found once, never looked for again as unknown
    assert driver._missed_at == {}


def test_the_looks_are_slurmctlds_message_timeout_apart(clock):
    config = DEFAULT.replace("MessageTimeout          = 10 sec", "MessageTimeout          = 45 sec")
    driver, _, estate = slurm_pool(Slurm(config=config))
    task = placed(estate)
    assert look(driver, task) is None
    assert driver.message_timeout_s == 45
    clock.now += 30
    assert look(driver, task) is None
    clock.now += 15
    assert look(driver, task).state is TaskState.QUEUED


def test_the_pools_message_timeout_wins_over_slurmctlds(clock):
    driver, _, _ = slurm_pool(Slurm(), message_timeout="90s")
    asyncio.run(driver._read_config())
    assert driver.message_timeout_s == 90


def test_a_transport_lost_after_sending_leaves_the_outcome_unknown_for_why():
    def lost(argv: list[str], account: str) -> Completed:
        raise TransportError("ssh: connection closed by remote host")

    driver, _, estate = slurm_pool(lost)
    with pytest.raises(SubmitUnknown):
        asyncio.run(driver.submit(placed(estate), "token"))
    assert "may exist" in str(driver.outcome_unknown(7))


def batch_pool(kind: str, answer: Any, **settings: Any) -> tuple[Any, Any]:
    """A PBS or LSF pool `p` whose commands `answer` answers, submission included."""
    estate = batch_estate(kind, **settings)
    context = Context(estate, Path("."), Path(__file__), None)
    driver_class = PbsDriver if kind == "pbs" else LsfDriver
    return driver_class(estate.pools["p"], context, SubmittingTransport(answer)), estate


# Lost replies as each command prints them, and refusals that queued nothing.
LOST_ELSEWHERE = [
    ("pbs", LOST_REPLY["pbspro"], SubmitUnknown),
    ("pbs", LOST_REPLY["torque"], SubmitUnknown),
    ("pbs", "qsub: Premature end of message", SubmitUnknown),
    ("lsf", LOST_REPLY["lsf"], SubmitUnknown),
    ("lsf", "Timeout on connect/receive call. Job not submitted.", SubmitUnknown),
    ("pbs", "qsub: Unknown queue", SubmitError),
    ("pbs", "qsub: cannot connect to server pbs1 (errno=111)", SubmitError),
    ("lsf", "No such queue. Job not submitted.", SubmitError),
]


@pytest.mark.parametrize(("kind", "words", "raised"), LOST_ELSEWHERE)
def test_pbs_and_lsf_submit_errors_are_classified_by_what_they_prove(kind, words, raised):
    driver, estate = batch_pool(kind, lambda argv, account: Completed(1, "", words + "\n"))
    with pytest.raises(raised) as caught:
        asyncio.run(driver.submit(placed(estate), "token"))
    assert caught.type is raised


@pytest.mark.parametrize(("kind", "looks_apart"), [("pbs", 30), ("lsf", 10)])
def test_pbs_and_lsf_look_twice_their_message_timeout_apart(clock, kind, looks_apart):
    driver, estate = batch_pool(kind, lambda argv, account: Completed(0, "", ""))
    task = placed(estate)
    assert look(driver, task) is None
    clock.now += looks_apart - 1
    assert look(driver, task) is None
    clock.now += 1
    assert look(driver, task).state is TaskState.QUEUED


@pytest.mark.parametrize("flavor", ["pbspro", "torque", "lsf"])
def test_the_simulators_queue_the_job_and_lose_the_reply(flavor):
    with simulated(flavor) as cluster:
        state = Path(cluster.env["KLIQUE_SIM_DIR"]) / flavor
        for folder in (state.parent, state):  # as the simulator makes them: any account's
            folder.mkdir(exist_ok=True)
            folder.chmod(0o1777)
        (state / "lose-replies").write_text("1")
        (state / "lose-replies").chmod(0o666)
        script = cluster.script("lost", "true\n")
        if flavor == "lsf":
            done = cluster.run("bsub", "-J", "lost", stdin=script.read_text())
        else:
            done = cluster.run("qsub", "-N", "lost", str(script))
        assert done.returncode != 0
        assert done.stderr.strip() == LOST_REPLY[flavor]
        assert (state / "lose-replies").read_text() == "0"
        assert len(cluster.states()) == 1  # queued all the same
        cluster.submit(cluster.script("next", "true\n"))  # the switch is spent: replies again
        assert len(cluster.states()) == 2


def test_klique_why_says_a_placed_tasks_outcome_is_unknown(tmp_path):
    driver, _, estate = slurm_pool(
        Slurm(sbatch="Unable to contact slurm controller (receive failure)")
    )
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    control = ControlLoop(store, estate, {"p": driver}, tmp_path)  # no cycle runs here
    task = store.create_task(TaskSpec(command=("true",), resource="r"), "alice", None)
    store.update(task.id, state=TaskState.PLACED, pool="p", job_dir=JOB_DIR)
    task = store.get(task.id)
    assert control.why(task) is None  # placed, its command not answered yet
    with pytest.raises(SubmitUnknown):
        asyncio.run(driver.submit(task, "token"))
    reason = control.why(task)
    assert reason is not None and reason.primary is PendingCode.OUTCOME_UNKNOWN
    assert "receive failure" in reason.text and "looks for its tag twice" in reason.text
    store.close()
