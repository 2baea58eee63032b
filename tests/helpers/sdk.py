"""The SDK as a researcher uses it in tests: scripts in a git checkout of alice's, run by
alice with the system's python3 and nothing installed but the SDK (the runner's zipapp)."""

from __future__ import annotations

import json
import pwd
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import TASK_PY, Server, shared_folder

from helpers.estates import estate_yaml, profile
from inside_job.zipapp import build

DATA = Path(__file__).resolve().parents[1] / "data" / "sdk"
GIT = ["git", "-c", "user.email=alice@example.com", "-c", "user.name=Alice"]
# The test process (root) reads alice's checkout: git is told to trust a folder it does not own.
TRUST = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}


class Checkout:
    """A git repository of alice's holding the SDK test scripts, and the SDK to run them."""

    def __init__(self) -> None:
        self.folder = shared_folder("klique-sdk-")
        self.folder.chmod(0o755)
        self.sdk = build(self.folder / "klique-sdk.pyz")
        self.sdk.chmod(0o644)
        self.repo = self.folder / "repo"
        self.repo.mkdir()
        for script in DATA.glob("*.py"):
            shutil.copy(script, self.repo / script.name)
        subprocess.run(["git", "init", "-q", str(self.repo)], check=True)
        subprocess.run([*GIT, "add", "."], cwd=self.repo, check=True)
        subprocess.run([*GIT, "commit", "-qm", "scripts"], cwd=self.repo, check=True)
        subprocess.run(["chown", "-R", "alice:alice", str(self.repo)], check=True)

    def run(
        self,
        server: Server,
        token: str,
        *argv: str,
        timeout: float = 300,
        background: bool = False,
        extra_env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
        """`python3 ARGV` as alice in the checkout, with her token for `server` (and extra_env)."""
        home = pwd.getpwnam("alice").pw_dir
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": home,
            "PYTHONPATH": str(self.sdk),
            "KLIQUE_API": server.url,
            "KLIQUE_TOKEN": token,
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        command = ["runuser", "-u", "alice", "--", "env", "-i"]
        command += [f"{k}={v}" for k, v in env.items()] + [TASK_PY, *argv]
        if background:
            return subprocess.Popen(
                command, cwd=self.repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        return subprocess.run(
            command, cwd=self.repo, capture_output=True, text=True, timeout=timeout, check=False
        )

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def trusted_checkout() -> Iterator[Checkout]:
    """A Checkout, removed afterwards, with git told (TRUST) to read alice's folder while it
    lives; as a context, so a fixture of any scope can hold it."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in TRUST.items():
            patch.setenv(key, value)
        made = Checkout()
        try:
            yield made
        finally:
            made.remove()


def recorded_id(output: str) -> int:
    """The task id the SDK printed when Task.init recorded the run."""
    found = re.search(r"klique: task (\d+) records this run", output)
    assert found, output
    return int(found.group(1))


def last_json(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("{")]
    assert lines, output
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def estate(pool: str, settings: Mapping[str, Any]) -> str:
    """cpu, 1-gpu and half-gpu on the one pool `pool` of these settings; pipeline controllers
    on cpu."""
    allocation = {"cpus": 1, "memory": "200M", "walltime": "10m"}
    return estate_yaml(
        defaults={"pipeline_resource": "cpu"},
        resources={
            "cpu": profile(pool, **allocation),
            "1-gpu": profile(pool, gpus=1, **allocation),
            "half-gpu": profile(pool, gpu_fraction=0.5, **allocation),
        },
        pools={pool: settings},
    )
