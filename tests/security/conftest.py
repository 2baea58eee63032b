"""Attackers and victims for the security tests: real servers whose tasks run as the Linux
accounts alice and bob, on a host pool and on the real Slurm pool (local and SSH transports)."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import HOST_ACCESS, Server
from helpers.batch import open_folder, pool_yaml, remove_tree

# What the server holds that no task may ever see: in its environment and its database URL.
SERVER_SECRET = f"server-secret-{secrets.token_hex(12)}"
RESOURCE = "resources:\n  cpu:\n    profile: {cpus: 1, memory: 200M, walltime: 10m, pools: [p]}\n"


@dataclass(frozen=True)
class Attack:
    """A server to attack, with a token for alice (the victim) and bob (the attacker)."""

    server: Server
    pool: str  # host, slurm or slurm-ssh
    job_root: Path
    alice: str
    bob: str


@dataclass(frozen=True)
class RootSecret:
    path: Path
    value: str

    def intact(self) -> bool:
        info = self.path.lstat()
        return (
            self.path.read_text() == self.value
            and info.st_uid == 0
            and info.st_mode & 0o777 == 0o600
        )


@pytest.fixture
def root_secret() -> Iterator[RootSecret]:
    """A file only root can read, in a folder every account can reach."""
    folder = Path(tempfile.mkdtemp(prefix="klique-secret-", dir="/tmp"))
    folder.chmod(0o755)
    path = folder / "secret"
    value = f"root-only-{secrets.token_hex(16)}"
    path.write_text(value)
    path.chmod(0o600)
    yield RootSecret(path, value)
    shutil.rmtree(folder, ignore_errors=True)


def host_estate(slots: int = 4, **settings: str) -> str:
    lines = "".join(f"    {key}: {value}\n" for key, value in settings.items())
    return (
        RESOURCE + f"pools:\n  p:\n    kind: host\n    slots: {slots}\n    {HOST_ACCESS}\n{lines}"
    )


# Two host pools, a and b, each served by its own `klique agent`.
REMOTE_POOLS = f"""
resources:
  a: {{profile: {{cpus: 1, memory: 200M, walltime: 10m, pools: [a]}}}}
  b: {{profile: {{cpus: 1, memory: 200M, walltime: 10m, pools: [b]}}}}
pools:
  a:
    kind: host
    agent: remote
    {HOST_ACCESS}
  b:
    kind: host
    agent: remote
    {HOST_ACCESS}
"""


@pytest.fixture
def remote_pools(
    server_factory: Callable[..., Server],
) -> tuple[Server, dict[str, str], dict[str, int], str]:
    """A server with REMOTE_POOLS, an agent token for each pool, alice's task placed in each,
    and alice's token."""
    server = server_factory(REMOTE_POOLS)
    with server.api() as api:
        tokens = {
            pool: api.post("/agent-tokens", json={"pools": [pool]}).json()["token"]
            for pool in ("a", "b")
        }
    for pool, token in tokens.items():
        with server.api(token) as agent:
            published = {"op": "published", "state": {"free_slots": 4}}
            answer = agent.post(f"/agent/pools/{pool}/calls", json={"calls": [published]})
            answer.raise_for_status()
    alice = server.make_token("alice")
    ids = {}
    with server.api(alice) as api:
        for pool in ("a", "b"):
            made = api.post("/tasks", json={"command": ["true"], "resource": pool})
            ids[pool] = made.json()["id"]
    for task_id in ids.values():
        server.wait_state(task_id, {"placed"})
    return server, tokens, ids, alice


# The pools an attack may run on; those on Slurm use the shared cluster (marker slurm: they join
# its worker in a parallel run, tests/conftest.py).
SLURM = pytest.param("slurm", marks=pytest.mark.slurm, id="slurm")
SLURM_SSH = pytest.param("slurm-ssh", marks=pytest.mark.slurm, id="slurm-ssh")


def slurm_estate(job_root: Path, endpoint: object = None, **settings: object) -> str:
    """One Slurm pool `p` (the real cluster), over SSH when an endpoint is given."""
    batch = pool_yaml("slurm", job_root, endpoint, **settings)  # type: ignore[arg-type]
    return RESOURCE + "pools:\n" + batch.replace("  batch:", "  p:")


@pytest.fixture
def slurm_job_root(slurm_cluster: object) -> Iterator[Path]:
    job_root = open_folder(slurm_cluster.work / f"security-{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]
    yield job_root
    remove_tree(job_root)


@pytest.fixture
def attack_factory(
    request: pytest.FixtureRequest, server_factory: Callable[..., Server]
) -> Iterator[Callable[..., Attack]]:
    """make(pool, **pool_settings): a server with one pool `p` of that kind, and tokens."""
    made: list[Path] = []

    def make(pool: str, **settings: object) -> Attack:
        env = {"AWS_SECRET_ACCESS_KEY": SERVER_SECRET}
        if pool == "host":
            server = server_factory(host_estate(**settings), **env)  # type: ignore[arg-type]
            assert server.job_root is not None
            job_root = server.job_root
        else:
            cluster = request.getfixturevalue("slurm_cluster")
            endpoint = request.getfixturevalue("sshd") if pool == "slurm-ssh" else None
            job_root = open_folder(cluster.work / f"security-{uuid.uuid4().hex[:8]}")
            made.append(job_root)
            server = server_factory(slurm_estate(job_root, endpoint, **settings), **env)
        return Attack(server, pool, job_root, server.make_token("alice"), server.make_token("bob"))

    yield make
    for folder in made:
        remove_tree(folder)


def as_account(account: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", account, "--", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def submit(attack: Attack, token: str, script: str, **fields: object) -> int:
    """A shell script as a task (no code captured); its id."""
    with attack.server.api(token) as api:
        answer = api.post("/tasks", json={"command": ["sh", "-c", script], **fields})
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def everything_seen(attack: Attack, task_id: int, token: str) -> str:
    """All a user can read of a task through the API: its record, events, logs, why."""
    with attack.server.api(token) as api:
        parts = [
            api.get(f"/tasks/{task_id}").text,
            api.get(f"/tasks/{task_id}/logs").text,
            api.get(f"/tasks/{task_id}/why").text,
        ]
    return "\n".join(parts)
