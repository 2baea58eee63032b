"""Job arrays: which tasks share one, what is written and submitted for it, what each element
runs (the dispatcher, run by bash), and how a restarted server finds a task's element."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from helpers.scripted_transport import ScriptedTransport

from broker.domain import Task, TaskState
from broker.execution import Submission
from broker.pools.arrays import ARRAY_NAME, array_name, dispatcher, elements_of
from broker.pools.base import Context
from broker.pools.batch import BatchDriver
from broker.pools.slurm import SlurmDriver, parse_squeue
from broker.preview import sample_task
from broker.transport import Completed, JobFolder

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
TWO_RESOURCES = """
resources:
  small: {profile: {pools: [p], cpus: 1, walltime: 5m}}
  large: {profile: {pools: [p], cpus: 4, walltime: 5m}}
pools:
  p: {kind: slurm, job_root: /jobs, poll_interval: 1s, user_map: {alice: alice, bob: bob}}
"""


class SubmittingTransport(ScriptedTransport):
    """Writes nothing: records the items of each write_and_submit_many call and the folders of
    each write_folders call, and answers every sbatch with the next job id."""

    def __init__(self) -> None:
        super().__init__(lambda argv, account: Completed(0, "", ""))
        self.batches: list[list[JobFolder]] = []
        self.next_id = 70

    async def write_and_submit_many(
        self, items: Sequence[JobFolder], *, account: str, timeout: float = 60.0
    ) -> list[Completed | Any]:
        self.batches.append(list(items))
        answers = []
        for item in items:
            if item.then:
                self.next_id += 1
                answers.append(Completed(0, f"{self.next_id}\n", ""))
            else:
                answers.append(Completed(0, "", ""))
        return answers

    async def write_folders(
        self, folders: Sequence[JobFolder], *, account: str, timeout: float = 60.0
    ) -> list[Any]:
        self.batches.append(list(folders))
        return [None] * len(folders)


def driver_for(text: str, tmp_path: Path) -> tuple[SlurmDriver, SubmittingTransport]:
    from broker.estate import parse_estate

    estate = parse_estate(text)
    runner = tmp_path / "klique-runner.pyz"
    runner.write_bytes(b"runner")
    transport = SubmittingTransport()
    return SlurmDriver(
        estate.pools["p"], Context(estate, tmp_path, runner, None), transport
    ), transport


def task(
    driver: BatchDriver, task_id: int, resource: str, sweep: int | None, owner: str = "alice"
) -> Task:
    base = sample_task(driver.context.estate, resource, owner)
    spec = replace(base.spec, resource=resource)
    return replace(
        base,
        id=task_id,
        spec=spec,
        sweep=sweep,
        state=TaskState.PLACED,
        job_dir=driver.new_job_dir(replace(base, id=task_id)),
    )


def pool_driver(cls: Any, text: str, tmp_path: Path) -> Any:
    """A driver of class `cls` for pool `p` of the estate `text`."""
    from broker.estate import parse_estate

    estate = parse_estate(text)
    runner = tmp_path / "klique-runner.pyz"
    runner.write_bytes(b"runner")
    return cls(estate.pools["p"], Context(estate, tmp_path, runner, None))


def found_after_restart(
    driver: Any, tasks: Sequence[Task], status_program: str, listing: str, folder: str, script: str
) -> tuple[dict[int, tuple[TaskState, str]], ScriptedTransport]:
    """A restarted server's first look at `tasks` (placed, their submission's outcome
    unknown): the status command lists `listing` and the array folder's dispatcher reads
    `script`. What each task was found as, and the transport's record of the commands."""

    def answer(argv: list[str], account: str) -> Completed:
        return Completed(0, listing if argv[0] == status_program else "", "")

    transport = ScriptedTransport(answer, {f"{folder}/job.sh": script.encode()})
    driver.transport = transport
    news = asyncio.run(driver.poll(tasks))
    return {t.id: (news[t.id].state, str(news[t.id].native_id)) for t in tasks}, transport


def test_a_sweeps_tasks_that_share_every_directive_go_as_one_array(tmp_path: Path) -> None:
    driver, transport = driver_for(TWO_RESOURCES, tmp_path)
    tasks = [
        *(task(driver, 10 + n, "small", sweep=1) for n in range(4)),
        task(driver, 20, "large", sweep=1),  # other directives: a job of its own
        task(driver, 21, "small", sweep=None),  # no sweep: a job of its own
        task(driver, 22, "small", sweep=1, owner="bob"),  # another account: its own job
    ]
    outcomes = asyncio.run(driver.submit_many([(t, "token") for t in tasks]))

    assert all(isinstance(o, Submission) for o in outcomes), outcomes
    ids = [o.native_id for o in outcomes if isinstance(o, Submission)]
    array = ids[0].split("_")[0]
    assert ids[:4] == [f"{array}_{n}" for n in range(4)]
    assert all("_" not in i for i in ids[4:]) and len(set(ids)) == len(ids)
    # The elements' folders: their task.json and job.sh, no runner, nothing submitted.
    elements = next(b for b in transport.batches if all(not item.then for item in b))
    assert [item.folder for item in elements] == [t.job_dir for t in tasks[:4]]
    assert all(set(item.files) == {"task.json", "job.sh"} for item in elements)
    # The array's folder: the runner once, and the dispatcher, submitted with sbatch.
    [array_item] = [item for b in transport.batches for item in b if "--array" in _text(item)]
    assert set(array_item.files) == {"klique-runner.pyz", "job.sh"}
    assert array_item.then == ["sbatch", "--parsable", f"{array_item.folder}/job.sh"]
    script = _text(array_item)
    assert "#SBATCH --array=0-3" in script
    assert f"#SBATCH --job-name={array_name(array_item.folder)}" in script
    assert f"#SBATCH --output={array_item.folder}/slurm-%j.out" in script
    assert f"#SBATCH --comment={array_name(array_item.folder)}" in script
    assert "#SBATCH --cpus-per-task=1" in script and "=klique-10\n" not in script
    assert elements_of(script) == {str(t.job_dir): n for n, t in enumerate(tasks[:4])}


def test_arrays_turned_off_or_a_lone_task_give_jobs_of_their_own(tmp_path: Path) -> None:
    text = TWO_RESOURCES.replace("poll_interval: 1s,", "poll_interval: 1s, job_arrays: false,")
    driver, transport = driver_for(text, tmp_path)
    tasks = [task(driver, 30 + n, "small", sweep=2) for n in range(3)]
    outcomes = asyncio.run(driver.submit_many([(t, "token") for t in tasks]))
    assert [o.native_id for o in outcomes if isinstance(o, Submission)] == ["71", "72", "73"]

    driver, transport = driver_for(TWO_RESOURCES, tmp_path)
    [outcome] = asyncio.run(driver.submit_many([(task(driver, 40, "small", sweep=3), "t")]))
    assert isinstance(outcome, Submission) and outcome.native_id == "71"


def test_the_agent_gets_each_sweep_whole_and_the_rest_in_batches(tmp_path: Path) -> None:
    driver, _ = driver_for(TWO_RESOURCES, tmp_path)
    sweep = [task(driver, n, "small", sweep=5) for n in range(1, 1201)]
    loose = [task(driver, n, "small", sweep=None) for n in range(2000, 2100)]
    sizes = [len(b) for b in driver.batches([*sweep, *loose])]
    assert sizes == [1000, 200, 64, 36]  # MaxArraySize bounds an array; 64 a command


def test_the_dispatcher_runs_the_elements_own_folder(tmp_path: Path) -> None:
    """bash runs the dispatcher as Slurm would for element 1: it links the runner into the
    element's folder and runs that folder's job.sh, its output in job.out."""
    array = tmp_path / "klique-5-0-0123456789ab"
    array.mkdir()
    (array / "klique-runner.pyz").write_bytes(b"the runner")
    folders = []
    for n in range(3):
        folder = tmp_path / f"klique-{5 + n}-1-00000000000{n}"
        folder.mkdir()
        job = folder / "job.sh"
        job.write_text(f'#!/bin/bash\necho "task {5 + n} in $PWD"; cat klique-runner.pyz\n')
        job.chmod(0o700)
        folders.append(str(folder))
    script = dispatcher(
        ["#SBATCH --job-name={tag}", "#SBATCH --array=0-2"],
        "SLURM_ARRAY_TASK_ID",
        str(array),
        array_name(str(array)),
        folders,
    )
    assert "#SBATCH --job-name=klique-array-5-0123456789ab" in script
    (array / "job.sh").write_text(script)  # where each element reads its line of the table
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "1"}
    done = subprocess.run(["bash", array / "job.sh"], cwd=folders[1], env=env, check=False)
    assert done.returncode == 0
    assert Path(folders[1], "job.out").read_text() == f"task 6 in {folders[1]}\nthe runner"
    assert not Path(folders[0], "job.out").exists()

    for index in ("3", "-1", "", "1x", "01"):
        wrong = subprocess.run(
            ["bash", array / "job.sh"],
            env={**env, "SLURM_ARRAY_TASK_ID": index},
            capture_output=True,
            text=True,
            check=False,
        )
        assert wrong.returncode == 1, index
        assert f"no task for array index {index}\n" in wrong.stderr, index
    assert not any(Path(f, "job.out").exists() for f in (folders[0], folders[2]))


def test_an_element_never_parses_the_table() -> None:
    """bash stops at the dispatcher's exec: the table after it is comments, read by line."""
    folders = [f"/jobs/klique-{n}-1-{n:012x}" for n in range(1, 1001)]
    script = dispatcher(["#SBATCH --array=0-999"], "SLURM_ARRAY_TASK_ID", "/jobs/a", "a", folders)
    code, _, table = script.partition("# Each element's index and its task's folder:\n")
    assert len(code) < 1200 and table.splitlines()[999] == f"# 999 {folders[999]}"
    assert elements_of(script) == {f: n for n, f in enumerate(folders)}


def test_squeue_lists_each_element_by_its_own_id() -> None:
    """Captured with `squeue --array --Format=JobArrayID:|,...`: pending elements one a line
    (without --array, one line for them all), each as ARRAY_INDEX; a plain job by its id."""
    jobs = {j.native_id: j for j in parse_squeue((DATA / "squeue-array.txt").read_text())}
    assert ARRAY_NAME.fullmatch(jobs["649_0"].name)
    assert (jobs["649_2"].state, jobs["649_2"].restarts) == ("PENDING", 1)
    assert jobs["649_3"].state == "CANCELLED"
    assert jobs["650"].name == "plain"


def test_a_restarted_server_finds_each_task_in_its_array_by_the_dispatcher(tmp_path: Path) -> None:
    """After a crash between sbatch and the record, a placed task with its folder is found in
    the array whose dispatcher names that folder, under its element's id."""
    driver, _ = driver_for(TWO_RESOURCES, tmp_path)
    tasks = [task(driver, 50 + n, "small", sweep=6) for n in range(3)]
    folder = "/jobs/klique-50-0-00000000abcd"
    script = dispatcher(
        ["#SBATCH --array=0-2"],
        "SLURM_ARRAY_TASK_ID",
        folder,
        array_name(folder),
        [str(t.job_dir) for t in tasks[::-1]],
    )
    listing = "".join(
        f"81_{n}|{array_name(folder)}|PENDING|None|0|{folder}/job.sh\n" for n in range(3)
    )

    found, _ = found_after_restart(driver, tasks, "squeue", listing, folder, script)
    assert found == {
        50: (TaskState.SUBMITTED, "81_2"),
        51: (TaskState.SUBMITTED, "81_1"),
        52: (TaskState.SUBMITTED, "81_0"),
    }


def _text(item: JobFolder) -> str:
    return item.files["job.sh"][0].decode()


def test_the_clusters_max_array_size_bounds_each_array(tmp_path: Path) -> None:
    """slurm.conf(5) MaxArraySize, read from `scontrol show config`: the agent hands a sweep
    over in arrays no larger."""
    driver, _ = driver_for(TWO_RESOURCES, tmp_path)

    def answer(argv: list[str], account: str) -> Completed:
        config = "MaxArraySize            = 4\nPrivateData             = none\n"
        return Completed(0, config if argv[0] == "scontrol" else "", "")

    driver.transport = ScriptedTransport(answer)
    asyncio.run(driver.poll([]))
    sweep = [task(driver, n, "small", sweep=8) for n in range(1, 11)]
    assert [len(b) for b in driver.batches(sweep)] == [4, 4, 2]


LSF_POOL = """
resources:
  small: {profile: {pools: [p], cpus: 1, walltime: 5m}}
pools:
  p: {kind: lsf, job_root: /jobs, poll_interval: 1s, user_map: {alice: alice, bob: bob}}
"""


def test_a_restarted_server_finds_each_task_in_its_lsf_array_by_the_name(tmp_path: Path) -> None:
    """bjobs shows no script path (bsub reads it on its stdin): the array's name names its
    folder in the job root, whose dispatcher places each task at an element `N[i]`, i from 1.
    Bob's array, named as hers and listed after it, is never taken for her tasks."""
    from broker.pools.lsf import LsfDriver

    driver = pool_driver(LsfDriver, LSF_POOL, tmp_path)
    tasks = [task(driver, 50 + n, "small", sweep=6) for n in range(3)]
    folder = "/jobs/klique-50-0-00000000abcd"
    name = array_name(folder)
    script = dispatcher(
        ['#BSUB -J "{tag}[1-3]"'],
        "LSB_JOBINDEX",
        folder,
        name,
        [str(t.job_dir) for t in tasks[::-1]],
        first=1,
    )
    records = [
        {"JOBID": job, "JOBINDEX": str(n), "STAT": "PEND", "USER": user, "JOB_NAME": f"{name}[{n}]"}
        for job, user in (("81", "alice"), ("90", "bob"))
        for n in range(1, 4)
    ]
    listing = json.dumps({"COMMAND": "bjobs", "JOBS": len(records), "RECORDS": records})

    found, _ = found_after_restart(driver, tasks, "bjobs", listing, folder, script)
    assert found == {
        50: (TaskState.SUBMITTED, "81[3]"),
        51: (TaskState.SUBMITTED, "81[2]"),
        52: (TaskState.SUBMITTED, "81[1]"),
    }


PBS_POOL = LSF_POOL.replace("kind: lsf", "kind: pbs")


def test_a_restarted_server_finds_each_task_in_its_pbs_array_by_the_dispatcher(
    tmp_path: Path,
) -> None:
    """qstat -t shows each subjob `N[i].server` with its array's name and the script qsub was
    given (Submit_arguments): the dispatcher there places each task at its index. Bob's array,
    named as hers, claiming her script and listed after it, is never taken for her tasks; then
    status names her array once, with -t."""
    from broker.pools.pbs import PbsDriver

    driver = pool_driver(PbsDriver, PBS_POOL, tmp_path)
    tasks = [task(driver, 50 + n, "small", sweep=6) for n in range(3)]
    folder = "/jobs/klique-50-0-00000000abcd"
    name = array_name(folder)
    script = dispatcher(
        ["#PBS -N {tag}", "#PBS -J 0-2"],
        "PBS_ARRAY_INDEX",
        folder,
        name,
        [str(t.job_dir) for t in tasks[::-1]],
    )
    jobs = {
        f"{number}[{n}].pbs01": {
            "Job_Name": name,
            "Job_Owner": f"{user}@login01",
            "job_state": "Q",
            "Submit_arguments": f"{folder}/job.sh",
        }
        for number, user in (("81", "alice"), ("90", "bob"))
        for n in range(3)
    }
    listing = json.dumps({"pbs_server": "pbs01", "Jobs": jobs})

    found, transport = found_after_restart(driver, tasks, "qstat", listing, folder, script)
    assert found == {
        50: (TaskState.SUBMITTED, "81[2].pbs01"),
        51: (TaskState.SUBMITTED, "81[1].pbs01"),
        52: (TaskState.SUBMITTED, "81[0].pbs01"),
    }
    assert [argv for argv, _ in transport.calls if argv[:2] == ["qstat", "-x"]] == [
        ["qstat", "-x", "-t", "-f", "-F", "json"]  # every job, to find them
    ]

    adopted = [replace(t, state=found[t.id][0], native_id=found[t.id][1]) for t in tasks]
    transport.calls.clear()
    asyncio.run(driver.poll(adopted))
    assert [argv for argv, _ in transport.calls if argv[:2] == ["qstat", "-x"]] == [
        ["qstat", "-x", "-t", "-f", "-F", "json", "81[].pbs01"]
    ]


def test_the_pbs_servers_max_array_size_bounds_each_array(tmp_path: Path) -> None:
    """pbs_server_attributes(7B) max_array_size, read from `qstat -B -f -F json`: the agent
    hands a sweep over in arrays no larger; 10000 where the server shows none."""
    from broker.estate import parse_estate
    from broker.pools.pbs import PbsDriver

    estate = parse_estate(PBS_POOL)
    context = Context(estate, tmp_path, tmp_path / "klique-runner.pyz", None)

    def server(attributes: dict[str, Any]) -> Callable[[list[str], str], Completed]:
        shown = json.dumps({"pbs_server": "pbs01", "Server": {"pbs01": attributes}})
        return lambda argv, account: Completed(0, shown if "-B" in argv else "{}", "")

    sizes = []
    for attributes in ({"max_array_size": 4}, {"server_state": "Active"}):
        driver = PbsDriver(estate.pools["p"], context, ScriptedTransport(server(attributes)))
        assert driver.max_array == 1000  # until the server has answered
        asyncio.run(driver.poll([]))
        sweep = [task(driver, n, "small", sweep=8) for n in range(1, 11)]
        sizes.append([len(b) for b in driver.batches(sweep)])
    assert sizes == [[4, 4, 2], [10]]


def test_a_dispatcher_written_before_the_table_ended_it_is_still_read() -> None:
    """A server upgraded while arrays run finds their tasks in the table they were given."""
    script = (
        'case "${SLURM_ARRAY_TASK_ID:-}" in\n'
        "0) dir=/jobs/klique-1-1-000000000001 ;;\n"
        "1) dir=/jobs/klique-2-1-000000000002 ;;\n"
        'esac\nexec "$dir/job.sh"\n'
    )
    assert elements_of(script) == {
        "/jobs/klique-1-1-000000000001": 0,
        "/jobs/klique-2-1-000000000002": 1,
    }
