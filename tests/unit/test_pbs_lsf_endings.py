"""PBS and LSF endings the drivers once misread, each on the simulator made to behave as the
real scheduler does, then read by the driver from the simulator's own output: a PBS job whose
MoM went down (F, substate 93, no Exit_status) is lost, not deleted; a subjob's "Subjob
failed" and "Subjob terminated" are kept; LSF's TERM_PREEMPT is a preemption; and suspended
jobs are not charged on either (docs/pbs-lsf-sites.md)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.estates import batch_estate
from helpers.scripted_transport import ScriptedTransport
from helpers.sim_cluster import Cluster, simulated, wait_for

from broker.domain import Task, TaskState
from broker.estate import parse_estate
from broker.pools.base import Context
from broker.pools.batch import BatchDriver
from broker.pools.lsf import LsfDriver
from broker.pools.pbs import PbsDriver
from broker.pools.pbs_parse import PBS_ALL_STATES, parse_qstat_json
from broker.preview import sample_task
from broker.transport import Completed
from inside_job.spec import TaskSpec

DATA = Path(__file__).resolve().parents[1] / "data"


def driver_answering(kind: str, stdout: str, **settings: Any) -> tuple[BatchDriver, Any]:
    """A `kind` pool whose status command prints `stdout`; no exit file is found."""
    estate = batch_estate(kind, **settings)
    context = Context(estate, Path("."), Path("klique-runner.pyz"), None)
    transport = ScriptedTransport(lambda argv, account: Completed(0, stdout, ""))
    driver_class = PbsDriver if kind == "pbs" else LsfDriver
    return driver_class(estate.pools["p"], context, transport), estate


def task_of(estate: Any, native_id: str, state: TaskState = TaskState.RUNNING) -> Task:
    task = sample_task(estate, "r", "alice")
    return replace(task, id=1, state=state, native_id=native_id, job_dir="/jobs/klique-1")


def poll(driver: BatchDriver, tasks: Sequence[Task]) -> dict[int, Any]:
    return asyncio.run(driver.poll(tasks))


def _job(cluster: Cluster, job_id: str) -> dict:
    """The simulator's record of a job ("1000.server": its number before the server)."""
    state = json.loads((cluster.work / "state" / cluster.flavor / "state.json").read_text())
    return next(j for j in state["jobs"].values() if str(j["id"]) == job_id.split(".")[0])


def _host_goes_down(cluster: Cluster, job_id: str) -> None:
    """The execution host dies under the job: its MoM (the simulator's supervisor) and the
    job's processes with it."""
    job = _job(cluster, job_id)
    os.killpg(job["pid"], signal.SIGKILL)  # the job leads a session of its own
    os.kill(job["daemon_pid"], signal.SIGKILL)


@pytest.mark.skipif(os.geteuid() != 0, reason="kills the simulated MoM, which runs as alice")
def test_a_non_rerunnable_pbs_job_whose_mom_went_down_is_lost_not_deleted():
    with simulated("pbspro") as cluster:
        script = cluster.script("momdown", "sleep 60\n")
        job_id = cluster.submit(script, "-r", "n")
        cluster.wait_state(job_id, "running")
        _host_goes_down(cluster, job_id)
        cluster.submit(cluster.script("next", "true\n"))  # the server tends its jobs again
        ended = cluster.wait_state(job_id, "done")["raw"]
        # OpenPBS req_jobobit.c (discard_job): failed, substate 93, no exit status at all.
        assert (ended["job_state"], ended["substate"]) == ("F", 93)
        assert "Exit_status" not in ended
        shown = cluster.run("qstat", "-x", "-f", "-F", "json", job_id).stdout
    [status] = parse_qstat_json(shown)
    assert status.state == "F/host" and PBS_ALL_STATES[status.state] is TaskState.LOST
    pbs, estate = driver_answering("pbs", shown)
    seen = poll(pbs, [task_of(estate, job_id)])[1]
    assert seen.state is TaskState.LOST
    assert "execution host went down" in seen.reason and "qdel" not in seen.reason


def test_a_failed_job_with_an_exit_status_and_a_deleted_one_keep_their_readings():
    text = json.dumps(
        {
            "Jobs": {
                "1.s": {"job_state": "F", "substate": 93, "Exit_status": 3, "Job_Name": "a"},
                "2.s": {"job_state": "F", "substate": 91, "Job_Name": "b"},
            }
        }
    )
    states = {s.native_id: s.state for s in parse_qstat_json(text)}
    assert states == {"1.s": "F/failed", "2.s": "F/deleted"}


def test_a_subjobs_comment_tells_a_failure_and_a_deletion():
    """OpenPBS array_func.c: a finished subjob shown through its array carries "Subjob
    finished", "Subjob failed" or "Subjob terminated"."""
    text = (DATA / "pbs" / "qstat_t_f_F_json_array.json").read_text()
    doc = json.loads(text)
    doc["Jobs"]["1000[0].pbs01"]["comment"] = "Subjob terminated"
    states = {s.native_id: s.state for s in parse_qstat_json(json.dumps(doc))}
    assert states["1000[0].pbs01"] == "X/deleted"
    assert states["1000[1].pbs01"] == "X/failed"  # "Subjob failed" in the capture
    assert PBS_ALL_STATES["X/deleted"] is TaskState.CANCELLED


def test_the_simulator_comments_a_subjob_deleted_while_it_ran():
    """Subjob 1 deleted while 2 still runs (the array, without job history, leaves once every
    subjob has ended)."""
    with simulated("pbspro") as cluster:
        cluster.env["KLIQUE_SIM_JOB_HISTORY_ENABLE"] = "false"
        release = cluster.work / "arr.release"
        body = f'[ "$PBS_ARRAY_INDEX" = 0 ] || while [ ! -e {release} ]; do sleep 0.05; done\n'
        done = cluster.run(
            "qsub", "-N", "arr", "-J", "0-2", "-o", "/dev/null", str(cluster.script("arr", body))
        )
        array = done.stdout.strip()
        number, server = array.split("[]")
        running = f"{number}[1]{server}"

        def listed() -> dict:
            shown = cluster.run("qstat", "-t", "-f", "-F", "json", array)
            return json.loads(shown.stdout).get("Jobs", {}) if shown.returncode == 0 else {}

        wait_for(lambda: listed().get(running, {}).get("job_state") == "R", what="subjob 1 runs")
        assert cluster.run("qdel", running).returncode == 0
        wait_for(lambda: listed().get(running, {}).get("job_state") == "X", what="it ends")
        assert listed()[running]["comment"] == "Subjob terminated"
        release.touch()


def test_lsfs_term_preempt_is_a_preemption():
    with simulated("lsf") as cluster:
        script = cluster.script("preempted", "sleep 60\n")
        job_id = cluster.submit(script, env={"KLIQUE_SIM_LSF_PREEMPT_AFTER": "1"})
        ended = cluster.wait_state(job_id, "done")
        assert ended["raw"]["STAT"] == "EXIT"
        assert ended["reason"] == "TERM_PREEMPT: job killed after preemption"
        fields = (
            "jobid jobindex stat user job_name exit_code exit_reason pend_reason suspend_reason"
        )
        shown = cluster.run("bjobs", "-a", "-o", fields, "-json", job_id).stdout
    lsf, estate = driver_answering("lsf", shown, requeue_preempted=True)
    seen = poll(lsf, [task_of(estate, job_id)])[1]
    assert (seen.state, seen.preempted) == (TaskState.FAILED, True)
    assert "TERM_PREEMPT" in seen.reason


LSF_ELEMENT = '{{"RECORDS": [{{"JOBID": "3000", "JOBINDEX": "2", "STAT": "{stat}", "USER": "alice", "JOB_NAME": "klique-sweep[2]", "PEND_REASON": "{reason}"}}]}}'  # noqa: E501


def test_an_lsf_job_seen_running_then_pending_was_requeued_and_its_wait_is_not_charged():
    """bjobs shows no count of requeues: brequeue or REQUEUE_EXIT_VALUES puts the running
    element back to PEND under its id (the simulator's brequeue, test_simulator_requeue.py)."""
    shown = [LSF_ELEMENT.format(stat="RUN", reason="")]
    transport = ScriptedTransport(lambda argv, account: Completed(0, shown[-1], ""))
    lsf, estate = driver_answering("lsf", "")
    lsf.transport = transport
    task = task_of(estate, "3000[2]")
    assert poll(lsf, [task]) == {}  # running, as the task is
    shown.append(LSF_ELEMENT.format(stat="PEND", reason="Job was requeued"))
    seen = poll(lsf, [task])[1]
    assert (seen.state, seen.requeued) == (TaskState.PENDING, True)
    assert "requeued by lsf (restart 1)" in seen.reason
    waiting = replace(task, state=TaskState.PENDING)
    assert poll(lsf, [waiting]) == {}  # pending, as it now is
    shown.append(LSF_ELEMENT.format(stat="RUN", reason=""))
    assert poll(lsf, [waiting])[1].state is TaskState.RUNNING
    # A job first seen pending has not been seen to run: nothing says it was requeued.
    fresh, estate = driver_answering("lsf", LSF_ELEMENT.format(stat="PEND", reason=""))
    assert not poll(fresh, [task_of(estate, "3000[2]")])[1].requeued


# One rule on every batch kind: a suspended job is not charged (Slurm's SUSPENDED is tested in
# test_slurm_states.py); a pool's `charge_phases: [suspended]` charges it.
LSF_SUSPENDED = '{{"RECORDS": [{{"JOBID": "3000", "JOBINDEX": "0", "STAT": "{stat}", "USER": "alice", "JOB_NAME": "klique-1", "SUSPEND_REASON": "The job was suspended by LSF"}}]}}'  # noqa: E501
PBS_SUSPENDED = '{{"Jobs": {{"1000.s": {{"job_state": "{stat}", "Job_Name": "klique-1", "Job_Owner": "alice@h"}}}}}}'  # noqa: E501


@pytest.mark.parametrize(
    ("kind", "listing", "stat", "job_id"),
    [
        ("lsf", LSF_SUSPENDED, "SSUSP", "3000"),
        ("lsf", LSF_SUSPENDED, "USUSP", "3000"),
        ("pbs", PBS_SUSPENDED, "S", "1000.s"),
        ("pbs", PBS_SUSPENDED, "U", "1000.s"),
    ],
)
def test_a_suspended_job_is_not_charged_unless_the_pool_says(kind, listing, stat, job_id):
    stdout = listing.format(stat=stat)
    driver, estate = driver_answering(kind, stdout)
    seen = poll(driver, [task_of(estate, job_id)])[1]
    assert (seen.state, seen.phase, seen.charged) == (TaskState.RUNNING, "suspended", False)
    charging, estate = driver_answering(kind, stdout, charge_phases=["suspended"])
    seen = poll(charging, [task_of(estate, job_id)])[1]
    assert (seen.phase, seen.charged) == ("suspended", True)


@pytest.mark.parametrize(
    ("profile", "settings", "asked", "home", "vendor"),
    [
        ("gpus: 1", "", True, "none", "nvidia"),
        ("gpu_fraction: 0.5", ", container_gpus: rocm", True, "none", "rocm"),
        ("cpus: 2", ", container_home: account", False, "account", "nvidia"),
    ],
)
def test_task_json_tells_the_runner_the_gpu_request_and_the_pools_container_settings(
    profile, settings, asked, home, vendor
):
    """Apptainer's --nv/--rocm follow the compute resource's request, --no-home the pool's
    `container_home` (docs/job-directory.md)."""
    estate = parse_estate(
        f"""
resources:
  r: {{profile: {{pools: [p], {profile}}}}}
pools:
  p: {{kind: lsf, job_root: /jobs, user_map: {{alice: alice}}{settings}}}
"""
    )
    driver = LsfDriver(estate.pools["p"], Context(estate, Path("."), Path("r.pyz"), None))
    doc = driver.task_document(sample_task(estate, "r", "alice"), "token")
    spec = TaskSpec(json.loads(json.dumps(doc)), "/jobs/klique-0")
    assert (spec.gpus_requested, spec.container_home, spec.container_gpus) == (asked, home, vendor)
