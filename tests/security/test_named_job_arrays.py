"""Job arrays on LSF and Torque (docs/job-arrays.md, "LSF", "Torque"): bjobs and Torque's
qstat show no script, so a restarted server finds an array's dispatcher by the array's name.
Any user may name a job so: only the account's own elements are taken for its tasks. On the
LSF and Torque simulators."""

from __future__ import annotations

import asyncio
import os
import pwd
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.batch import (
    login_node,
    looked_for,
    open_folder,
    pool_yaml,
    remove_tree,
    shared_folder,
)

from broker.domain import Estate, TaskSpec, TaskState
from broker.estate import parse_estate
from broker.pools.arrays import array_name, dispatcher
from broker.pools.base import Context
from broker.pools.batch import BatchDriver
from broker.pools.lsf import LsfDriver
from broker.pools.pbs import PbsDriver
from broker.preview import sample_task

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs as alice and bob")


# Torque's server shows a user only their own jobs unless query_other_jobs is set (TORQUE 6.1
# "Server parameters": false by default); many sites set it, and then Bob's job shows.
SITES = {
    "lsf": ("lsf", {}),
    "torque": ("torque", {}),
    "torque-query_other_jobs": ("torque", {"KLIQUE_SIM_QUERY_OTHER_JOBS": "true"}),
}


@pytest.fixture(params=list(SITES))
def site(
    request: pytest.FixtureRequest, test_users: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Path, Path]]:
    """The scheduler, its simulator's bin folder first on PATH, and a job root every account
    may write."""
    scheduler, settings = SITES[request.param]
    folder = shared_folder(f"klique-{scheduler}-array-attack-")
    try:
        bin_dir = login_node(folder, scheduler, open_folder(folder / "sim"), settings=settings)
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        yield scheduler, bin_dir, open_folder(folder / "jobs")
    finally:
        remove_tree(folder)


def held_job(scheduler: str, bin_dir: Path, submitter: str, name: str) -> tuple[str, str]:
    """A held array of one element named `name`, submitted as `submitter`: (array, element)."""
    as_submitter = ["runuser", "-u", submitter, "--"]
    if scheduler == "lsf":
        submit = [*as_submitter, str(bin_dir / "bsub"), "-H", "-J", f"{name}[1-1]"]
        submit += ["-o", "/dev/null", "true"]
        answer = subprocess.run(submit, capture_output=True, text=True, check=True).stdout
        job = answer.split("<", 1)[1].split(">", 1)[0]
        return job, f"{job}[1]"
    # Torque: qsub -t 0-0 reads the script on its standard input; prints `N[].server`.
    submit = [*as_submitter, str(bin_dir / "qsub"), "-h", "-N", name, "-t", "0-0"]
    submit += ["-o", "/dev/null", "-e", "/dev/null"]
    done = subprocess.run(submit, input="true\n", capture_output=True, text=True, check=True)
    array = done.stdout.strip()
    number, _, server = array.partition("[]")
    return array, f"{number}[0]{server}"


def driver_for(scheduler: str, estate: Estate, home: Path) -> BatchDriver:
    kind = LsfDriver if scheduler == "lsf" else PbsDriver
    return kind(estate.pools["batch"], Context(estate, home, home, None))


def owned(account: str, path: Path, mode: int) -> Path:
    entry = pwd.getpwnam(account)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("submitter", ["bob", "alice"])
def test_a_job_named_as_an_accounts_array_is_hers_only_if_she_submitted_it(
    site: tuple[str, Path, Path], tmp_path: Path, submitter: str
) -> None:
    """Alice's task is placed with its folder, its submission's outcome unknown (a crash);
    her array folder holds a dispatcher that names it. A held array of one element named as
    hers: Bob's is not hers (her task goes again); her own is (the check that the test can
    tell)."""
    scheduler, bin_dir, job_root = site
    estate = parse_estate(
        "resources:\n"
        "  cpu:\n"
        "    profile: {cpus: 1, memory: 100M, walltime: 5m, pools: [batch]}\n"
        f"pools:\n{pool_yaml(scheduler, job_root, None, message_timeout='1s')}"
    )
    driver = driver_for(scheduler, estate, tmp_path)
    folder = job_root / "klique-41-1-00000000cafe"
    folder.mkdir()
    owned("alice", folder, 0o700)
    array = job_root / "klique-41-0-00000000beef"
    array.mkdir()
    owned("alice", array, 0o700)
    name = array_name(str(array))
    naming = "-J" if scheduler == "lsf" else "-N"  # bsub -J, qsub -N
    directives = driver.array_directives([f"{driver.DIRECTIVE} {naming} {{tag}}"], 1)
    assert driver.array_index is not None
    first = driver.ARRAY_FIRST
    script = dispatcher(directives, driver.array_index, str(array), name, [str(folder)], first)
    (array / "job.sh").write_text(script)
    owned("alice", array / "job.sh", 0o700)
    task = replace(
        sample_task(estate, "cpu", "alice"),
        id=41,
        spec=TaskSpec(("true",), "cpu"),
        state=TaskState.PLACED,
        job_dir=str(folder),
    )
    his = replace(task, id=46, owner="bob", job_dir=f"{job_root}/klique-none-of-his")
    job, element = held_job(scheduler, bin_dir, submitter, name)
    try:
        seen = looked_for(driver, [task, his], task)
    finally:
        cancel = "bkill" if scheduler == "lsf" else "qdel"
        kill = ["runuser", "-u", submitter, "--", str(bin_dir / cancel), job]
        subprocess.run(kill, capture_output=True, check=False)
        asyncio.run(driver.close())
    if submitter == "alice":
        assert (seen.state, seen.native_id) == (TaskState.SUBMITTED, element)
    else:
        assert seen.state is TaskState.QUEUED and seen.native_id is None, seen
