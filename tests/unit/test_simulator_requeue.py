"""The simulators' requeue commands, PBS Professional's qrerun and LSF's brequeue: what they
answer, what they refuse, and a requeued job running again (tests/fakes/README.md)."""

from __future__ import annotations

import json
import os

import pytest
from helpers.sim_cluster import Cluster, as_account, simulated, wait_for

# qrerun is a PBS manager's or operator's command: root's, here.
as_manager = pytest.mark.skipif(os.geteuid() != 0, reason="qrerun needs root, a PBS manager")


@pytest.fixture
def cluster(request):
    with simulated(request.param) as sim:
        yield sim


# Runs once and waits for <name>.release; run again (the marker left), ends at once.
TWICE = (
    'if [ -e "{marker}" ]; then exit 0; fi\n'
    'touch "{marker}"\n'
    'while [ ! -e "{release}" ]; do sleep 0.05; done\n'
)


def _qstat(cluster: Cluster, *argv: str) -> dict:
    shown = cluster.run("qstat", *argv, "-f", "-F", "json")
    return json.loads(shown.stdout).get("Jobs", {}) if shown.returncode == 0 else {}


@as_manager
@pytest.mark.parametrize("cluster", ["pbspro"], indirect=True)
def test_qrerun_kills_a_running_job_and_runs_it_again_with_its_run_count(cluster):
    marker, release = cluster.work / "ran", cluster.work / "never"
    job = cluster.submit(cluster.script("twice", TWICE.format(marker=marker, release=release)))
    running = cluster.wait_state(job, "running")
    assert running["raw"]["run_count"] == 1
    wait_for(marker.exists, what="the first run")

    by_owner = cluster.run("qrerun", job)  # a manager's or operator's request only
    assert (by_owner.returncode, by_owner.stderr) == (159, f"qrerun: Unauthorized Request  {job}\n")
    done = cluster.run("qrerun", job, as_root=True)  # answered once the job is queued again
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")

    ended = cluster.wait_state(job, "done")
    assert ended["exit"] == 0 and ended["raw"]["run_count"] == 2
    again = cluster.run("qrerun", job, as_root=True)
    assert (again.returncode, again.stderr) == (35, "qrerun: Job has finished\n")


@as_manager
@pytest.mark.parametrize("cluster", ["pbspro"], indirect=True)
def test_qrerun_refuses_as_openpbs_words_it(cluster):
    server = cluster.submit(cluster.script("probe", "true")).split(".", 1)[1]
    unknown = cluster.run("qrerun", f"999.{server}", as_root=True)
    assert (unknown.returncode, unknown.stderr) == (153, f"qrerun: Unknown Job Id 999.{server}\n")
    usage = cluster.run("qrerun", "-W", "soft", "1.x", as_root=True)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: qrerun [-W force]")

    held = cluster.submit(cluster.script("held", "true"), "-h")
    queued = cluster.run("qrerun", held, as_root=True)
    assert (queued.returncode, queued.stderr) == (
        168,
        f"qrerun: Request invalid for state of job {held}\n",
    )

    release = cluster.work / "fixed.release"
    body = f'while [ ! -e "{release}" ]; do sleep 0.05; done\n'
    fixed = cluster.submit(cluster.script("fixed", body), "-r", "n")
    cluster.wait_state(fixed, "running")
    refused = cluster.run("qrerun", fixed, as_root=True)
    assert (refused.returncode, refused.stderr) == (190, f"qrerun: job is not rerunnable {fixed}\n")
    forced = cluster.run("qrerun", "-W", "force", fixed, as_root=True)
    assert forced.returncode == 0, forced.stderr
    wait_for(lambda: cluster.status(fixed)["raw"].get("run_count") == 2, what="the second run")
    release.touch()
    cluster.wait_state(fixed, "done")
    cluster.cancel(held)


@as_manager
@pytest.mark.parametrize("cluster", ["pbspro"], indirect=True)
def test_qrerun_of_an_array_job_reruns_running_subjobs_and_queues_ended_ones_again(cluster):
    """qrerun N[]: subjob 0, ended, is queued again and runs first; subjob 1, killed, waits
    queued with its own record (run_count 1, Exit_status -11 JOB_EXEC_RERUN) while 0 holds
    every CPU; qrerun N[i] of a subjob that does not run is refused."""
    cluster.env["KLIQUE_SIM_JOB_HISTORY_ENABLE"] = "false"  # PBS Professional's default
    seen, rel0, rel1 = (cluster.work / n for n in ("seen0", "rel0", "rel1"))
    body = (
        f'if [ "$PBS_ARRAY_INDEX" = 1 ]; then while [ ! -e "{rel1}" ]; do sleep 0.05; done;'
        " exit 0; fi\n"
        f'if [ -e "{seen}" ]; then while [ ! -e "{rel0}" ]; do sleep 0.05; done; exit 0; fi\n'
        f'touch "{seen}"\n'
    )
    array = cluster.submit(cluster.script("arr", body), "-J", "0-1", "-l", "select=1:ncpus=16")
    number, server = array.split("[]")
    first, second = f"{number}[0]{server}", f"{number}[1]{server}"

    def states() -> list[str | None]:
        jobs = _qstat(cluster, "-t", array)
        return [jobs.get(first, {}).get("job_state"), jobs.get(second, {}).get("job_state")]

    wait_for(lambda: states() == ["X", "R"], what="subjob 0 to end while 1 runs")
    ended = cluster.run("qrerun", first, as_root=True)
    assert (ended.returncode, ended.stderr) == (
        168,
        f"qrerun: Request invalid for state of job {first}\n",
    )
    outside = cluster.run("qrerun", f"{number}[7]{server}", as_root=True)
    assert (outside.returncode, outside.stderr) == (
        156,
        f"qrerun: Invalid request {number}[7]{server}\n",
    )

    done = cluster.run("qrerun", array, as_root=True)
    assert (done.returncode, done.stderr) == (0, "")
    wait_for(lambda: states() == ["R", "Q"], what="subjob 0 to run again while 1 waits")
    waiting = _qstat(cluster, "-t", array)[second]
    assert (waiting["run_count"], waiting["Exit_status"], waiting["array_index"]) == (1, -11, 1)
    assert _qstat(cluster, "-t", array)[first]["run_count"] == 2
    rel0.touch()
    wait_for(lambda: states() == ["X", "R"], what="subjob 1's second run")
    assert _qstat(cluster, "-t", array)[second]["run_count"] == 2
    rel1.touch()
    wait_for(lambda: not _qstat(cluster, "-t", array), what="the array to leave the server")


@pytest.mark.parametrize("cluster", ["lsf"], indirect=True)
def test_brequeue_kills_a_running_element_which_runs_again_under_its_id(cluster):
    release = cluster.work / "never"
    body = TWICE.format(marker=cluster.work / "ran.$LSB_JOBINDEX", release=release)
    done = cluster.run("bsub", "-J", "arr[1-2]", stdin="#!/bin/sh\n" + body)
    array = done.stdout.split("<")[1].split(">")[0]
    element = f"{array}[2]"
    cluster.wait_state(element, "running")
    wait_for((cluster.work / "ran.2").exists, what="the element's first run")

    other = as_account("bob", cluster, "brequeue", element)
    assert (other.returncode, other.stderr) == (255, f"Job <{element}> : User permission denied\n")
    requeued = cluster.run("brequeue", element)
    assert (requeued.returncode, requeued.stdout) == (0, f"Job <{element}> is being requeued \n")
    assert cluster.wait_state(element, "done")["raw"]["STAT"] == "DONE"  # its second run
    assert cluster.status(f"{array}[1]")["state"] == "running"  # the other element untouched

    finished = cluster.run("brequeue", element)
    assert (finished.returncode, finished.stderr) == (
        255,
        f"Job <{element}> : Job has already finished\n",
    )
    held = cluster.run("brequeue", "-d", "-H", element)  # a DONE job, queued again held
    assert held.stdout == f"Job <{element}> is being requeued \n"
    assert cluster.status(element)["raw"]["STAT"] == "PSUSP"
    pending = cluster.run("brequeue", element)
    assert pending.stderr == f"Job <{element}> : Job has not started yet\n"
    missing = cluster.run("brequeue", f"{array}[9]")
    assert missing.stderr == f"Job <{array}[9]> : No matching job found\n"
    assert cluster.cancel(array).returncode == 0
