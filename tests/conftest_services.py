"""Session fixtures for the real services on loopback, started once by scripts/*-up.

A fixture skips only when its script is absent (or fails when KLIQUE_REQUIRE_SERVICES=1)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


# The markers of tests that need a real service; off unless turned on (they may install
# packages and start daemons): `make test` sets KLIQUE_REQUIRE_SERVICES=1.
SERVICE_MARKERS = {
    "slurm": "the real Slurm cluster",
    "postgres": "PostgreSQL",
    "ssh": "sshd on loopback",
    "chaos": "the chaos suite (it stops and starts services)",
}


def services_on() -> bool:
    return "1" in (os.environ.get("KLIQUE_REQUIRE_SERVICES"), os.environ.get("KLIQUE_SERVICES"))


def skip_reason(what: str) -> str:
    return f"needs {what}: run `make test`, or scripts/services-up then KLIQUE_SERVICES=1 pytest"


def run_script(name: str, *args: str, timeout: float = 900) -> str:
    """Run scripts/NAME and return the last line it printed; fail with its output otherwise.
    Services that are not turned on are never started (their scripts may install packages)."""
    if name != "test-users" and not services_on():
        pytest.skip(skip_reason(f"the service of scripts/{name}"))
    script = SCRIPTS / name
    if not script.exists():
        message = f"{script} is absent, so the service it starts is not available"
        if os.environ.get("KLIQUE_REQUIRE_SERVICES") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    done = subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        pytest.fail(
            f"{script} {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}",
            pytrace=False,
        )
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else ""


@dataclass(frozen=True)
class SlurmCluster:
    dir: Path
    conf: Path
    work: Path  # open to every user (sticky, like /tmp): job scripts and output go here
    jobcomp: Path  # what `sacct -c` reads


@dataclass(frozen=True)
class SSHEndpoint:
    host: str
    port: int
    known_hosts: Path
    client_key: Path
    accounts: tuple[str, ...]


@pytest.fixture(scope="session")
def test_users() -> tuple[str, str]:
    """Ordinary Linux accounts (alice, bob) to run as."""
    run_script("test-users")
    return ("alice", "bob")


@pytest.fixture(scope="session")
def slurm_cluster(test_users: tuple[str, str]) -> SlurmCluster:
    """The single-node Slurm cluster of scripts/slurm-up (node localhost, 4 fake GPUs)."""
    run_script("slurm-up")
    folder = Path(os.environ.get("KLIQUE_SLURM_DIR", "/tmp/klique-slurm"))
    return SlurmCluster(
        folder, folder / "etc/slurm.conf", folder / "work", folder / "log/jobcomp.txt"
    )


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """A SQLAlchemy URL for the database `klique_test` on the server of scripts/pg-up."""
    return run_script("pg-up")


@pytest.fixture(scope="session")
def sshd(test_users: tuple[str, str]) -> SSHEndpoint:
    """The sshd of scripts/sshd-up on 127.0.0.1, with a client key authorized for alice and bob."""
    run_script("sshd-up")
    folder = Path(os.environ.get("KLIQUE_SSH_DIR", "/tmp/klique-ssh"))
    port = int(os.environ.get("KLIQUE_SSH_PORT", "2222"))
    return SSHEndpoint("127.0.0.1", port, folder / "known_hosts", folder / "client_key", test_users)


@pytest.fixture(scope="session")
def oidc_url() -> str:
    """The OpenID Connect provider of scripts/oidc-up (tests/services/oidc_provider.py)."""
    return run_script("oidc-up")


@pytest.fixture(scope="session")
def ldap_url() -> str:
    """The slapd of scripts/ldap-up (ldaps://127.0.0.1:6636; StartTLS on 3389)."""
    return run_script("ldap-up")
