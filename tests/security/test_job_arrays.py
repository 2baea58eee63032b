"""Job arrays (docs/job-arrays.md): another account's array job is never taken for a task's,
whatever its dispatcher names; a sweep's values never reach the array's script."""

from __future__ import annotations

import asyncio
import os
import pwd
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.batch import JOB_PYTHON, looked_for, sticky_job_root

from broker.domain import Task, TaskSpec, TaskState
from broker.errors import KliqueError
from broker.estate import parse_estate
from broker.pools.arrays import array_name, dispatcher, elements_of
from broker.pools.base import Context
from broker.pools.slurm import SlurmDriver
from broker.preview import sample_task
from broker.transport import Completed, JobFolder, LocalTransport

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="runs as alice and bob"),
]

ESTATE = """
resources:
  cpu: {{profile: {{cpus: 1, memory: 100M, walltime: 5m, pools: [slurm]}}}}
pools:
  slurm: {{kind: slurm, partition: debug, job_root: {job_root}, python: {python},
          poll_interval: 1s, message_timeout: 1s, user_map: {{alice: alice, bob: bob}}}}
"""


@pytest.fixture
def job_root(slurm_cluster: Any) -> Any:
    with sticky_job_root("klique-array-attack-") as root:
        yield root


def folder_of(account: str, path: Path, mode: int) -> Path:
    path.mkdir(mode=mode)
    entry = pwd.getpwnam(account)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(mode)
    return path


def array_job(account: str, job_root: Path, first: int, elements: list[str]) -> str:
    """An array job of `account`'s, named and laid out as Klique's, held in Slurm's queue; its
    dispatcher (readable by all) names `elements`."""
    folder = folder_of(account, job_root / f"klique-{first}-0-{first:012x}", 0o755)
    script = folder / "job.sh"
    name = array_name(str(folder))
    text = dispatcher(
        [f"#SBATCH --array=0-{len(elements) - 1}"],
        "SLURM_ARRAY_TASK_ID",
        str(folder),
        name,
        elements,
    )
    script.write_text(text)
    script.chmod(0o755)
    entry = pwd.getpwnam(account)
    os.chown(script, entry.pw_uid, entry.pw_gid)
    submit = [
        "runuser",
        "-u",
        account,
        "--",
        "sbatch",
        "--parsable",
        "--hold",
        f"--job-name={name}",
        f"--output={folder}/%j.out",
        str(script),
    ]
    return subprocess.run(submit, capture_output=True, text=True, check=True).stdout.strip()


def placed_task(job_root: Path, tmp_path: Path, base: int) -> tuple[SlurmDriver, Task, Task]:
    """A Slurm pool; Alice's task, placed with its folder and its submission's outcome unknown
    (as after a crash); and a task of Bob's in the pool, so that status lists his jobs too."""
    estate = parse_estate(ESTATE.format(job_root=job_root, python=JOB_PYTHON))
    driver = SlurmDriver(estate.pools["slurm"], Context(estate, tmp_path, tmp_path, None))
    first = base + os.getpid() % 1000 * 10
    folder = folder_of("alice", job_root / f"klique-{first}-1-{first:012x}", 0o700)
    task = replace(
        sample_task(estate, "cpu", "alice"),
        id=first,
        spec=TaskSpec(("true",), "cpu"),
        state=TaskState.PLACED,
        job_dir=str(folder),
    )
    his = replace(task, id=first + 5, owner="bob", job_dir=f"{job_root}/klique-none-of-his")
    return driver, task, his


@pytest.mark.parametrize("owner_of_the_array", ["bob", "alice"])
def test_another_accounts_array_job_is_never_taken_for_a_task(
    job_root: Path, tmp_path: Path, owner_of_the_array: str
) -> None:
    """Alice's task is placed with its folder, its submission's outcome unknown (a crash). Bob
    holds an array job laid out as Klique's whose dispatcher, readable by all, names her
    folder: her task is submitted again, not tied to his job. The same job of her own is hers
    (the check that the test can tell)."""
    driver, task, his = placed_task(job_root, tmp_path, 900_000 + (owner_of_the_array == "alice"))
    folder = Path(str(task.job_dir))
    array = array_job(owner_of_the_array, job_root, task.id, [str(folder)])
    try:
        # Bob has a task in the pool too: status lists his jobs with hers.
        seen = looked_for(driver, [task, his], task)
    finally:
        subprocess.run(["scancel", array], check=False)
        asyncio.run(driver.close())
    if owner_of_the_array == "alice":
        assert (seen.state, seen.native_id) == (TaskState.SUBMITTED, f"{array}_0")
    else:
        assert seen.state is TaskState.QUEUED and seen.native_id is None, seen


class Recording(LocalTransport):
    """Writes and submits nothing: keeps each job folder, and answers sbatch with job 77."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[JobFolder] = []

    async def write_and_submit_many(
        self, items: Sequence[JobFolder], *, account: str, timeout: float = 60.0
    ) -> list[Completed | KliqueError]:
        self.items += items
        return [Completed(0, "77\n" if item.then else "", "") for item in items]

    async def write_folders(
        self, folders: Sequence[JobFolder], *, account: str, timeout: float = 60.0
    ) -> list[KliqueError | None]:
        self.items += folders
        return [None] * len(folders)


def test_a_sweeps_values_never_reach_the_array_script(tmp_path: Path) -> None:
    """Each element runs its own task's job.sh, where the runner reads task.json: names,
    arguments and values stay out of the dispatcher, which holds only Klique's own paths."""
    estate = parse_estate(ESTATE.format(job_root="/jobs", python=JOB_PYTHON))
    runner = tmp_path / "runner.pyz"
    runner.write_bytes(b"runner")
    transport = Recording()
    context = Context(estate, tmp_path, runner, None)
    driver = SlurmDriver(estate.pools["slurm"], context, transport)
    hostile = ["$(touch /tmp/pwned)", "`id`", "; rm -rf ~", "x\n#SBATCH --uid=0", "'\"{tag}"]
    tasks = []
    for n, value in enumerate(hostile):
        spec = TaskSpec(("echo", value), "cpu", name=value)
        base = replace(sample_task(estate, "cpu", "alice"), id=70 + n, spec=spec, sweep=3)
        tasks.append(replace(base, job_dir=driver.new_job_dir(base), parameters={"v": value}))
    outcomes = asyncio.run(driver.submit_many([(t, "token") for t in tasks]))
    assert [getattr(o, "native_id", o) for o in outcomes] == [f"77_{n}" for n in range(5)]
    [array] = [item for item in transport.items if item.then]
    script = array.files["job.sh"][0].decode()
    for value in hostile:
        assert value not in script
    assert "pwned" not in script and "--uid" not in script and "{tag}" not in script
    assert subprocess.run(["bash", "-n", "-c", script], check=False).returncode == 0


@pytest.mark.parametrize("script_of_its_own", [False, True])
def test_a_wrapped_job_with_a_tasks_tag_is_never_taken_for_it(
    job_root: Path, tmp_path: Path, script_of_its_own: bool
) -> None:
    """Bob's `sbatch --wrap` named with the tag of Alice's task (whose submission's outcome
    is unknown) shows no script in squeue: it is not hers. A job from her folder's job.sh is
    (the check that the test can tell)."""
    driver, task, his = placed_task(job_root, tmp_path, 950_000 + script_of_its_own)
    folder = Path(str(task.job_dir))
    if script_of_its_own:
        script = folder / "job.sh"
        script.write_text("#!/bin/sh\ntrue\n")
        os.chown(script, pwd.getpwnam("alice").pw_uid, -1)
        how = ["runuser", "-u", "alice", "--", "sbatch", f"--output={folder}/%j.out", str(script)]
    else:
        how = ["runuser", "-u", "bob", "--", "sbatch", "--output=/dev/null", "--wrap=true"]
    submit = [*how[:5], "--parsable", "--hold", f"--job-name={task.tag}", *how[5:]]
    job = subprocess.run(submit, capture_output=True, text=True, check=True).stdout.strip()
    try:
        seen = looked_for(driver, [task, his], task)
    finally:
        subprocess.run(["scancel", job], check=False)
        asyncio.run(driver.close())
    if script_of_its_own:
        assert (seen.state, seen.native_id) == (TaskState.SUBMITTED, job)
    else:
        assert seen.state is TaskState.QUEUED and seen.native_id is None, seen


def test_a_table_names_only_folders_klique_makes() -> None:
    """An edited dispatcher's line that names another path is not read back as a task's
    folder, and no dispatcher is written with one."""
    planted = (
        "# Each element's index and its task's folder:\n"
        "# 0 /jobs/klique-1-1-000000000001\n"
        "# 1 /etc\n"
        "# 2 /jobs/klique-3-1-000000000003/../../home/bob\n"
        "2) dir=/home/bob ;;\n"
    )
    assert elements_of(planted) == {"/jobs/klique-1-1-000000000001": 0}
    with pytest.raises(ValueError, match="not a job folder"):
        dispatcher([], "SLURM_ARRAY_TASK_ID", "/jobs/a", "a", ["/jobs/klique-1-1-000000000001 x"])
