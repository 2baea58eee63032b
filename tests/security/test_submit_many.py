"""Many job folders in one command (unpack-each, then submit-each for a burst of submissions):
each is new, made by its account, and a name planted first by another account fails that item
alone; a folder not named as Klique names job folders is never made, by the transport or by the
sudo helper."""

from __future__ import annotations

import asyncio
import os
import pwd
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers.batch import open_folder, sticky_job_root
from helpers.confined import confined_helper

from broker import fileops
from broker.errors import CommandFailed
from broker.transport import Completed, JobFolder, LocalTransport

from .conftest import as_account

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs as alice and bob")

SECRET_TASK = b'{"report": {"token": "alice-secret-token"}}'
FILES = {"task.json": (SECRET_TASK, 0o600), "job.sh": (b"#!/bin/sh\ntrue\n", 0o700)}


@pytest.fixture
def job_root(test_users: Any) -> Any:
    with sticky_job_root("klique-many-attack-") as root:
        yield root


@pytest.fixture
def helper(job_root: Path) -> Any:
    """The sudo helper, installed with the job root as its only one."""
    with confined_helper([job_root]) as installed:
        yield installed


def name(n: int) -> str:
    return f"klique-{n}-1-{n:012x}"


class HelperTransport(LocalTransport):
    """The file operations through the sudo helper (run as the account by runuser)."""

    def __init__(self, helper: Path) -> None:
        super().__init__()
        self.helper = helper

    def op(self, name: str, *args: str) -> list[str]:
        return [str(self.helper), name, *args]


def submit_many(items: list[JobFolder]) -> list[Completed | Exception]:
    async def scenario() -> list[Completed | Exception]:
        return list(await LocalTransport().write_and_submit_many(items, account="alice"))

    return asyncio.run(scenario())


def test_folders_planted_by_another_account_are_never_written_into(job_root: Path) -> None:
    """bob makes two of the names first: a folder open to all, and a link to one. alice's
    files land in neither (her task.json holds her report token), and her other folders are
    made and submitted in the same command."""
    bobs = open_folder(job_root.parent / "bobs")
    assert as_account("bob", "mkdir", "-m", "777", f"{job_root}/{name(2)}").returncode == 0
    assert as_account("bob", "ln", "-s", str(bobs), f"{job_root}/{name(3)}").returncode == 0
    items = [
        JobFolder(f"{job_root}/{name(n)}", FILES, ["sbatch", "--version"]) for n in (1, 2, 3, 4)
    ]
    outcomes = submit_many(items)
    assert [type(o).__name__ for o in outcomes] == [
        "Completed",
        "CommandFailed",
        "CommandFailed",
        "Completed",
    ]
    assert all("exists already" in str(o) for o in outcomes[1:3])
    assert_only_alices_folders_written(job_root, bobs)


def assert_only_alices_folders_written(job_root: Path, bobs: Path) -> None:
    """bob's planted folder (name 2) and the one his link names are empty; names 1 and 4 are
    alice's private folders with her files, which bob cannot read."""
    assert os.listdir(job_root / name(2)) == [] and os.listdir(bobs) == []
    alice = pwd.getpwnam("alice").pw_uid
    for n in (1, 4):
        info = os.lstat(job_root / name(n))
        assert (info.st_uid, stat.S_IMODE(info.st_mode), stat.S_ISDIR(info.st_mode)) == (
            alice,
            0o700,
            True,
        )
        files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (job_root / name(n)).iterdir()}
        assert files == {"task.json": 0o600, "job.sh": 0o700}
        assert (job_root / name(n) / "task.json").read_bytes() == SECRET_TASK
        peek = as_account("bob", "cat", f"{job_root}/{name(n)}/task.json")
        assert peek.returncode != 0 and "alice-secret-token" not in peek.stdout


@pytest.mark.parametrize("transport", ["scripts", "helper"])
def test_an_arrays_folders_planted_by_another_account_are_never_written_into(
    job_root: Path, helper: Path, transport: str
) -> None:
    """An array's element folders, all made in one command: bob makes two of the names first
    (a folder open to all, a link to one). Those two fail alone and stay empty; the others are
    alice's, private, with their files."""
    bobs = open_folder(job_root.parent / "bobs")
    assert as_account("bob", "mkdir", "-m", "777", f"{job_root}/{name(2)}").returncode == 0
    assert as_account("bob", "ln", "-s", str(bobs), f"{job_root}/{name(3)}").returncode == 0
    chosen = LocalTransport() if transport == "scripts" else HelperTransport(helper)
    folders = [JobFolder(f"{job_root}/{name(n)}", FILES, ()) for n in (1, 2, 3, 4)]
    outcomes = asyncio.run(chosen.write_folders(folders, account="alice"))
    assert [type(o).__name__ for o in outcomes] == [
        "NoneType",
        "CommandFailed",
        "CommandFailed",
        "NoneType",
    ], outcomes
    assert all("exists already" in str(o) for o in outcomes[1:3])
    assert_only_alices_folders_written(job_root, bobs)


def test_a_folder_not_named_as_klique_names_job_folders_is_never_made(job_root: Path) -> None:
    """Outside the job folder pattern (a `..` on the way, another base name, a relative path):
    refused before anything runs, while the well-named folder beside them is made."""
    bad = [f"{job_root}/../{name(5)}", f"{job_root}/evil", name(6), f"{job_root}/{name(7)}/x"]
    items = [JobFolder(path, FILES, ["sbatch", "--version"]) for path in bad]
    items.append(JobFolder(f"{job_root}/{name(8)}", FILES, ["sbatch", "--version"]))
    outcomes = submit_many(items)
    assert all(isinstance(o, CommandFailed) for o in outcomes[:-1]), outcomes
    assert all("not a job folder" in str(o) for o in outcomes[:-1])
    assert isinstance(outcomes[-1], Completed) and outcomes[-1].returncode == 0
    # The same names as an array's elements.
    folders = [JobFolder(path, FILES, ()) for path in bad]
    folders.append(JobFolder(f"{job_root}/{name(10)}", FILES, ()))
    made = asyncio.run(LocalTransport().write_folders(folders, account="alice"))
    assert all("not a job folder" in str(o) for o in made[:-1]) and made[-1] is None, made
    assert sorted(os.listdir(job_root)) == sorted([name(8), name(10)])
    assert not (job_root.parent / name(5)).exists()


def test_the_helper_refuses_a_folder_not_named_as_klique_names_them(
    job_root: Path, helper: Path
) -> None:
    """The sudo helper, called as alice with a name the transport would never send: nothing
    is made, and it says so by its exit code."""
    tar = fileops.tar_of(FILES)
    for names in ([f"../{name(9)}"], ["evil"], [name(11), f"x/{name(12)}"]):
        done = subprocess.run(
            ["runuser", "-u", "alice", "--", str(helper), "unpack-each"] + [str(job_root), *names],
            input=tar,
            capture_output=True,
            check=False,
        )
        assert (done.returncode, done.stdout) == (fileops.UNPACK_FAILED, b""), done.stderr
    assert os.listdir(job_root) == [] and not (job_root.parent / name(9)).exists()
