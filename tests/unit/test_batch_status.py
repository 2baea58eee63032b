"""The batch driver's status flow against scripted scheduler answers: status per account where
the scheduler hides other users' jobs, a PBS server without job history, an unreadable record,
and a job that left the queue with only the scheduler's note to say why."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from helpers.estates import batch_estate
from helpers.scripted_transport import Answer, ScriptedTransport

from broker.domain import Task, TaskState
from broker.pools.base import Context
from broker.pools.lsf import LsfDriver
from broker.pools.pbs import PbsDriver
from broker.preview import sample_task
from broker.transport import Completed

DATA = Path(__file__).resolve().parents[1] / "data"


TORQUE = {"dialect": "torque"}


def pool_of(settings: Mapping[str, Any], answer: Answer, files: Mapping[str, bytes] | None = None):
    estate = batch_estate("pbs", **settings)
    context = Context(estate, Path("."), Path("klique-runner.pyz"), None)
    transport = ScriptedTransport(answer, files)
    return PbsDriver(estate.pools["p"], context, transport), transport, estate


def running(estate: Any, task_id: int, owner: str, native_id: str) -> Task:
    task = sample_task(estate, "r", owner)
    return replace(
        task,
        id=task_id,
        state=TaskState.RUNNING,
        native_id=native_id,
        job_dir=f"/jobs/klique-{task_id}",
    )


def poll(driver: PbsDriver, tasks: Sequence[Task]) -> dict[int, Any]:
    return asyncio.run(driver.poll(tasks))


def torque_job(job_id: str, name: str, state: str, exit_status: int | None = None) -> str:
    lines = [f"Job Id: {job_id}", f"    Job_Name = {name}", f"    job_state = {state}"]
    if exit_status is not None:
        lines.append(f"    exit_status = {exit_status}")
    return "\n".join(lines) + "\n\n"


OWNERS = {"1.tq": "alice", "2.tq": "bob"}
EXIT_OK = {"/jobs/klique-2/exit.json": b'{"exit_code": 0, "outcome": "completed", "reason": "ok"}'}
JOBS = {"1.tq": ("klique-1", "R", None), "2.tq": ("klique-2", "C", 0)}


def torque_hiding_others(argv: list[str], account: str) -> Completed:
    """query_other_jobs false: another account's job is refused, the others are listed."""
    ids = [a for a in argv if a in JOBS]
    shown = "".join(torque_job(i, *JOBS[i]) for i in ids if OWNERS[i] == account)
    refused = [f"qstat: Unauthorized Request  {i}" for i in ids if OWNERS[i] != account]
    return Completed(159 if refused else 0, shown, "".join(f"{r}\n" for r in refused))


def status_queries(transport: ScriptedTransport) -> list[tuple[list[str], str]]:
    """The job status queries, without the server's own (`qstat -B`: its job array limit)."""
    return [(argv, account) for argv, account in transport.calls if "-B" not in argv]


def test_a_server_that_hides_other_users_jobs_is_asked_once_per_account(caplog):
    driver, transport, estate = pool_of(TORQUE, torque_hiding_others, EXIT_OK)
    tasks = [running(estate, 1, "alice", "1.tq"), running(estate, 2, "bob", "2.tq")]
    with caplog.at_level(logging.WARNING, "klique.pools"):
        seen = poll(driver, tasks)
    assert seen[2].state is TaskState.COMPLETED and 1 not in seen  # 1 still runs
    assert status_queries(transport) == [
        (["qstat", "-f", "-1", "1.tq", "2.tq"], "alice"),
        (["qstat", "-f", "-1", "1.tq"], "alice"),
        (["qstat", "-f", "-1", "2.tq"], "bob"),
    ]
    [line] = [r.getMessage() for r in caplog.records if "own jobs" in r.getMessage()]
    assert "one query per mapped account" in line and "status_per_account: true" in line
    transport.calls.clear()
    poll(driver, tasks[:1] + [replace(tasks[1], native_id="3.tq")])
    assert [account for _, account in status_queries(transport)] == ["alice", "bob"]


def test_status_per_account_set_in_the_estate_asks_per_account_from_the_start():
    driver, transport, estate = pool_of(
        {**TORQUE, "status_per_account": True}, torque_hiding_others, EXIT_OK
    )
    tasks = [running(estate, 1, "alice", "1.tq"), running(estate, 2, "bob", "2.tq")]
    seen = poll(driver, tasks)
    assert seen[2].state is TaskState.COMPLETED
    assert sorted(account for _, account in status_queries(transport)) == ["alice", "bob"]
    assert len(status_queries(transport)) == 2


def test_with_status_per_account_false_a_refusal_is_the_pools_error():
    driver, transport, estate = pool_of(
        {**TORQUE, "status_per_account": False}, torque_hiding_others
    )
    tasks = [running(estate, 1, "alice", "1.tq"), running(estate, 2, "bob", "2.tq")]
    try:
        poll(driver, tasks)
    except Exception as exc:  # noqa: BLE001 - the pool shows unreachable with these words
        assert "Unauthorized Request" in str(exc)
    else:
        raise AssertionError("the refused query should fail the poll")
    assert len(status_queries(transport)) == 1


# Two arrays of one subjob each, alice's and bob's: array id -> (owner, subjob, its task's tag).
ARRAYS = {"10[].tq": ("alice", "10[1].tq", "klique-1"), "11[].tq": ("bob", "11[1].tq", "klique-2")}


def torque_silent_on_others_arrays(argv: list[str], account: str) -> Completed:
    """Torque at its default query_other_jobs false (qstat -B -f -1 shows it), asked with -t:
    another account's array named by its id shows nothing and exits 0 (TORQUE
    src/server/req_stat.c), as the simulator does (test_simulators.py)."""
    if "-B" in argv:
        return Completed(0, (DATA / "torque" / "qstat_B_f_1.txt").read_text(), "")
    named = [ARRAYS[a] for a in argv if a in ARRAYS] or list(ARRAYS.values())
    shown = [torque_job(sub, tag, "R") for owner, sub, tag in named if owner == account]
    return Completed(0, "".join(shown), "")


def test_torque_hiding_other_accounts_arrays_is_read_from_the_server_at_start():
    driver, transport, estate = pool_of(TORQUE, torque_silent_on_others_arrays)
    tasks = [
        replace(running(estate, 1, "alice", "10[1].tq"), state=TaskState.PENDING),
        replace(running(estate, 2, "bob", "11[1].tq"), state=TaskState.PENDING),
    ]
    asyncio.run(driver.check())  # the pool's start, which reads the server's settings
    transport.calls.clear()
    seen = poll(driver, tasks)
    assert (seen[1].state, seen[2].state) == (TaskState.RUNNING, TaskState.RUNNING)
    assert status_queries(transport) == [
        (["qstat", "-t", "-f", "-1", "10[].tq"], "alice"),
        (["qstat", "-t", "-f", "-1", "11[].tq"], "bob"),
    ]


def test_torques_listing_for_a_lost_submit_reply_runs_as_each_account():
    """A task whose submission's outcome is unknown is looked for in a listing without ids,
    which Torque filters to the asker's own jobs: it runs as each account."""
    driver, transport, estate = pool_of(TORQUE, torque_silent_on_others_arrays)
    unknown = replace(running(estate, 2, "bob", "11[1].tq"), state=TaskState.PLACED)
    asyncio.run(driver.check())
    transport.calls.clear()
    poll(driver, [running(estate, 1, "alice", "10[1].tq"), replace(unknown, native_id=None)])
    assert sorted(account for _, account in status_queries(transport)) == ["alice", "bob"]


LSF_PARAMS = """System default queues for automatic queue selection:
    normal

    MAX_JOB_ARRAY_SIZE = 1000
    SECURE_JOB_INFO_LEVEL = {level}
"""
LSF_JOBS = {"3001": "alice", "3002": "bob"}


def lsf_at_level(level: int) -> Any:
    """lsb.params SECURE_JOB_INFO_LEVEL: from 1, bjobs shows each user only their own jobs
    and says nothing of the others (the simulator, test_simulators.py)."""

    def answer(argv: list[str], account: str) -> Completed:
        if argv[0] == "bparams":
            return Completed(0, LSF_PARAMS.format(level=level), "")
        if argv[0] != "bjobs":
            return Completed(0, "", "")  # the start's other checks
        named = argv[argv.index("-json") + 1 :]
        records = [
            {"JOBID": job, "JOBINDEX": "0", "STAT": "RUN", "USER": owner,
             "JOB_NAME": f"klique-{job[-1]}"}
            for job, owner in LSF_JOBS.items()
            if job in named and (not level or owner == account)
        ]  # fmt: skip
        return Completed(0, json.dumps({"RECORDS": records}), "")

    return answer


def test_lsfs_secure_job_info_level_is_read_at_start_and_status_runs_per_account():
    found = []
    for level in (0, 1):
        estate = batch_estate("lsf")
        context = Context(estate, Path("."), Path("klique-runner.pyz"), None)
        transport = ScriptedTransport(lsf_at_level(level))
        driver = LsfDriver(estate.pools["p"], context, transport)
        asyncio.run(driver.check())  # the pool's start
        transport.calls.clear()
        tasks = [
            replace(running(estate, 1, "alice", "3001"), state=TaskState.PENDING),
            replace(running(estate, 2, "bob", "3002"), state=TaskState.PENDING),
        ]
        seen = poll(driver, tasks)
        assert sorted(seen) == [1, 2] and {s.state for s in seen.values()} == {TaskState.RUNNING}
        found.append([(argv[argv.index("-json") + 1 :], a) for argv, a in transport.calls])
    # bjobs names the pool's jobs, never -u all: each account's own where others are hidden.
    assert found == [[(["3001", "3002"], "alice")], [(["3001"], "alice"), (["3002"], "bob")]]


def pbs_without_history(argv: list[str], account: str) -> Completed:
    ids = [a for a in argv if a.endswith(".pbs01")]
    header = {"timestamp": 1, "pbs_version": "2022.1.3", "pbs_server": "pbs01"}
    if "-x" in argv:
        refused = "".join(
            f"qstat: PBS is not configured to maintain job history {i}\n" for i in ids
        )
        return Completed(0, json.dumps(header), refused)
    jobs = {"4323.pbs01": {"Job_Name": "klique-1", "job_state": "R"}}
    shown = {i: jobs[i] for i in ids if i in jobs}
    gone = "".join(f"qstat: Unknown Job Id {i}\n" for i in ids if i not in jobs)
    return Completed(153 if gone else 0, json.dumps({**header, "Jobs": shown}), gone)


def test_a_pbs_server_without_history_is_asked_without_x_for_the_rest_of_its_life(caplog):
    driver, transport, estate = pool_of({}, pbs_without_history)
    task = running(estate, 1, "alice", "4323.pbs01")
    with caplog.at_level(logging.WARNING, "klique.pools"):
        assert poll(driver, [task]) == {}  # running, as it was
        assert poll(driver, [task]) == {}
    argvs = [argv for argv, _ in transport.calls if "-B" not in argv]  # the job queries
    assert argvs == [
        ["qstat", "-x", "-f", "-F", "json", "4323.pbs01"],
        ["qstat", "-f", "-F", "json", "4323.pbs01"],
        ["qstat", "-f", "-F", "json", "4323.pbs01"],
    ]
    history = [r for r in caplog.records if "no job history" in r.getMessage()]
    assert len(history) == 1 and "exit file" in history[0].getMessage()


def test_a_job_that_left_a_history_less_server_is_decided_by_its_files():
    signalled = {"exit_code": 143, "outcome": "signalled", "reason": "terminated by SIGTERM"}
    note = b"=>> PBS: job killed: walltime 6 exceeded limit 5\n"
    files = {
        "/jobs/klique-1/exit.json": json.dumps(signalled).encode(),
        "/jobs/klique-1/pbs.out": note,
        "/jobs/klique-2/exit.json": json.dumps(signalled).encode(),
        "/jobs/klique-2/pbs.out": b"",
    }
    driver, _, estate = pool_of({}, pbs_without_history, files)
    tasks = [running(estate, 1, "alice", "4401.pbs01"), running(estate, 2, "alice", "4402.pbs01")]
    seen = poll(driver, tasks)
    assert seen[1].state is TaskState.TIMEOUT and "walltime" in seen[1].reason
    assert seen[2].state is TaskState.FAILED  # a SIGTERM with no walltime note: not a timeout


def test_an_unreadable_record_leaves_its_task_alone_and_the_others_go_on(caplog):
    good = '"4325.pbs01":{"Job_Name":"klique-2","job_state":"F","substate":92,"Exit_status":0}'
    bad = '"4323.pbs01":{"Job_Name":"klique-1",,"job_state":"R"}'
    text = '{"pbs_server":"pbs01","Jobs":{' + bad + "," + good + "}}"
    exit_ok = {"exit_code": 0, "outcome": "completed", "reason": "exited with code 0"}
    files = {"/jobs/klique-2/exit.json": json.dumps(exit_ok).encode()}
    driver, _, estate = pool_of({}, lambda argv, account: Completed(0, text, ""), files)
    tasks = [running(estate, 1, "alice", "4323.pbs01"), running(estate, 2, "alice", "4325.pbs01")]
    with caplog.at_level(logging.WARNING, "klique.pools"):
        for _ in range(3):
            seen = poll(driver, tasks)
            assert 1 not in seen
            assert 1 not in driver.memory.missing_since  # listed: never on its way to LOST
    assert seen[2].state is TaskState.COMPLETED
    logged = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(logged) == 1 and "4323.pbs01" in logged[0]
