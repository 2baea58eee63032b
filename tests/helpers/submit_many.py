"""One scenario of `Transport.write_and_submit_many`, run through each transport (runuser and
its shell scripts, SSH, sudo and the helper): every transport must answer it the same way."""

from __future__ import annotations

import asyncio
import os
import pwd
import subprocess
import uuid
from pathlib import Path
from typing import Any

from broker.errors import CommandFailed
from broker.transport import Completed, JobFolder, Transport
from helpers.batch import open_folder, remove_tree

FILES = {"task.json": (b'{"id": 1}', 0o600), "job.sh": (b"#!/bin/sh\ntrue\n", 0o700)}
# Job folder names as Klique makes them (klique-ID-ATTEMPT-HEX): the only ones unpack-each makes.
NAMES = {key: f"klique-{n}-1-{n:012x}" for n, key in enumerate("abcd", 1)}
NAMES |= {"taken": "klique-8-1-00000000beef", "linked": "klique-9-1-00000000f00d"}


def as_bob(*argv: str) -> None:
    subprocess.run(["runuser", "-u", "bob", "--", *argv], check=True, capture_output=True)


def sbatch_itself(*args: str) -> str:
    """What sbatch prints as alice, run directly: what an item must hand back unchanged."""
    done = subprocess.run(
        ["runuser", "-u", "alice", "--", "sbatch", *args], capture_output=True, text=True
    )
    return done.stdout + done.stderr


def run_scenario(transport: Transport, parent: Path = Path("/tmp")) -> dict[str, Any]:
    """Six job folders in one call as alice, in a job root (made in `parent`) where bob made a
    folder and a link under two of the names first. Returns what a caller sees, and what is on
    disk."""
    root = open_folder(parent / f"klique-many-{uuid.uuid4().hex[:8]}")
    try:
        as_bob("mkdir", "-m", "777", f"{root}/{NAMES['taken']}")
        as_bob("ln", "-s", "/etc", f"{root}/{NAMES['linked']}")
        items = [
            JobFolder(f"{root}/{NAMES['a']}", FILES, ["sbatch", "--version"]),
            JobFolder(f"{root}/{NAMES['taken']}", FILES, ["sbatch", "--version"]),
            JobFolder(f"{root}/{NAMES['b']}", FILES, ["sbatch", "--help"]),
            JobFolder(f"{root}/{NAMES['linked']}", FILES, ["sbatch", "--version"]),
            JobFolder(
                f"{root}/{NAMES['c']}", FILES, ["sbatch", "--no-such-option"], then_stdin="job.sh"
            ),
            JobFolder(f"{root}/{NAMES['d']}", FILES, ["cat", "/etc/hostname"]),
        ]
        before = transport.commands

        async def scenario() -> list[Completed | Exception]:
            try:
                return list(await transport.write_and_submit_many(items, account="alice"))
            finally:
                await transport.close()

        outcomes = asyncio.run(scenario())
        alice = pwd.getpwnam("alice").pw_uid
        return {
            "commands": transport.commands - before,
            "outcomes": [_shown(o) for o in outcomes],
            "folders": {
                key: (os.stat(root / name).st_uid == alice, oct(os.stat(root / name).st_mode))
                for key, name in NAMES.items()
                if len(key) == 1
            },
            "files": sorted(
                (p.name, oct(p.stat().st_mode & 0o777), p.stat().st_uid == alice)
                for p in (root / NAMES["a"]).iterdir()
            ),
            "taken": sorted(os.listdir(root / NAMES["taken"])),
            "linked": os.readlink(root / NAMES["linked"]),
        }
    finally:
        remove_tree(root)


def _shown(outcome: Completed | Exception) -> tuple[Any, ...]:
    if isinstance(outcome, CommandFailed):
        return ("CommandFailed", "exists already" in str(outcome))
    if isinstance(outcome, Exception):
        return (type(outcome).__name__, str(outcome))
    return (outcome.returncode, outcome.stdout + outcome.stderr)


def expected() -> dict[str, Any]:
    version = sbatch_itself("--version")
    return {
        "commands": 2,  # unpack-each for the folders, submit-each for the submissions
        "outcomes": [
            (0, version),
            ("CommandFailed", True),  # bob's folder: refused, nothing written into it
            (0, sbatch_itself("--help")),  # many lines, intact
            ("CommandFailed", True),  # bob's link: never followed
            (255, sbatch_itself("--no-such-option")),  # the command's own failure, its words
            (126, "klique: runs only sbatch, qsub, bsub after unpack\n"),
        ],
        "folders": dict.fromkeys("abcd", (True, "0o40700")),
        "files": [("job.sh", "0o700", True), ("task.json", "0o600", True)],
        "taken": [],
        "linked": "/etc",
    }
