"""Job arrays on LSF (docs/job-arrays.md, "LSF"): bjobs shows no script, so a restarted server
finds an array's dispatcher by the array's name. Any user may name a job so: only the
account's own elements are taken for its tasks. On the LSF simulator."""

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
from batch_helpers import login_node, open_folder, pool_yaml, remove_tree, shared_folder

from broker.domain import TaskSpec, TaskState
from broker.estate import parse_estate
from broker.pools.arrays import array_name, dispatcher
from broker.pools.base import Context
from broker.pools.lsf import LsfDriver
from broker.preview import sample_task

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs as alice and bob")


@pytest.fixture
def site(test_users: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """The simulator's bin folder first on PATH, and a job root every account may write."""
    folder = shared_folder("klique-lsf-array-attack-")
    try:
        bin_dir = login_node(folder, "lsf", open_folder(folder / "sim"))
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        yield bin_dir, open_folder(folder / "jobs")
    finally:
        remove_tree(folder)


def owned(account: str, path: Path, mode: int) -> Path:
    entry = pwd.getpwnam(account)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("submitter", ["bob", "alice"])
def test_a_job_named_as_an_accounts_array_is_hers_only_if_she_submitted_it(
    site: tuple[Path, Path], tmp_path: Path, submitter: str
) -> None:
    """Alice's task is placed with its folder, its submission's outcome unknown (a crash);
    her array folder holds a dispatcher that names it. A held job named as that array, with
    its element 1: Bob's is not hers (her task goes again); her own is (the check that the
    test can tell)."""
    bin_dir, job_root = site
    estate = parse_estate(
        "resources:\n"
        "  cpu:\n"
        "    profile: {cpus: 1, memory: 100M, walltime: 5m, pools: [batch]}\n"
        f"pools:\n{pool_yaml('lsf', job_root, None)}"
    )
    driver = LsfDriver(estate.pools["batch"], Context(estate, tmp_path, tmp_path, None))
    folder = job_root / "klique-41-1-00000000cafe"
    folder.mkdir()
    owned("alice", folder, 0o700)
    array = job_root / "klique-41-0-00000000beef"
    array.mkdir()
    owned("alice", array, 0o700)
    name = array_name(str(array))
    script = dispatcher(
        ['#BSUB -J "{tag}[1-1]"'], "LSB_JOBINDEX", str(array), name, [str(folder)], 1
    )
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
    submit = ["runuser", "-u", submitter, "--", str(bin_dir / "bsub"), "-H"]
    submit += ["-J", f"{name}[1-1]", "-o", "/dev/null", "true"]
    answer = subprocess.run(submit, capture_output=True, text=True, check=True).stdout
    job = answer.split("<", 1)[1].split(">", 1)[0]
    try:
        seen = asyncio.run(driver.poll([task, his]))[task.id]
    finally:
        kill = ["runuser", "-u", submitter, "--", str(bin_dir / "bkill"), job]
        subprocess.run(kill, capture_output=True, check=False)
        asyncio.run(driver.close())
    if submitter == "alice":
        assert (seen.state, seen.native_id) == (TaskState.SUBMITTED, f"{job}[1]")
    else:
        assert seen.state is TaskState.QUEUED and seen.native_id is None, seen
