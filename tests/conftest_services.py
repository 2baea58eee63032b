"""Session fixtures for the real services on loopback, started once by scripts/*-up.

A fixture skips only when its script is absent (or fails when KLIQUE_REQUIRE_SERVICES=1)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.container_images import podman_image

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


# The markers of tests that need a real service; off unless turned on (they may install
# packages and start daemons): `make test` sets KLIQUE_REQUIRE_SERVICES=1.
SERVICE_MARKERS = {
    "slurm": "the real Slurm cluster",
    "postgres": "PostgreSQL",
    "ssh": "sshd on loopback",
    "chaos": "the chaos suite (it stops and starts services)",
    "podman": "podman, running real containers",
}


def services_on() -> bool:
    return "1" in (os.environ.get("KLIQUE_REQUIRE_SERVICES"), os.environ.get("KLIQUE_SERVICES"))


def skip_reason(what: str) -> str:
    return f"needs {what}: run `make test`, or scripts/services-up then KLIQUE_SERVICES=1 pytest"


def run_script(
    name: str, *args: str, timeout: float = 900, env: dict[str, str] | None = None
) -> str:
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
        [str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
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


# A second, private cluster beside the shared one, with a site's ordinary settings that the shared
# cluster must not be given: PrivateData=jobs (squeue shows each user only their own jobs),
# JobRequeue=1 (a batch job goes back to the queue after a node failure), a hidden partition
# (squeue lists its jobs only with --all), preemption by requeue: a job of the `urgent`
# partition (a higher PriorityTier) that needs the node puts the jobs in its way back to the
# queue (slurm.conf(5) PreemptType=preempt/partition_prio, PreemptMode=REQUEUE), and a Prolog
# that a test can make fail once (tests/data/slurm/prolog-fails-once). Its own folder
# and ports; munge is shared; /etc/slurm keeps pointing at the shared cluster.
SITE_SLURM = {
    "KLIQUE_SLURM_DIR": "/tmp/klique-slurm-sites",
    "KLIQUE_SLURM_CTLD_PORT": "6917",
    "KLIQUE_SLURM_SLURMD_PORT": "6918",
    "KLIQUE_SLURM_CLUSTER": "sites",
    "KLIQUE_SLURM_CONF_EXTRA": "PrivateData=jobs\nJobRequeue=1\n"
    "PartitionName=hidden Nodes=localhost MaxTime=INFINITE State=UP Hidden=YES\n"
    "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE\n"
    "PartitionName=urgent Nodes=localhost MaxTime=INFINITE State=UP PriorityTier=10\n"
    f"Prolog={Path(__file__).parent / 'data/slurm/prolog-fails-once'}",
}


@pytest.fixture(scope="session")
def site_slurm_cluster(test_users: tuple[str, str]) -> Iterator[SlurmCluster]:
    """A private cluster with PrivateData=jobs and JobRequeue=1 (use its `conf` as SLURM_CONF);
    stopped at the end of the session, its state kept."""
    yield from private_cluster(SITE_SLURM)


# A third private cluster: two nodes n1 and n2 on this host, each its own slurmd on its own port
# (scripts/slurm-up KLIQUE_SLURM_NODES), for tasks on several nodes; the nodes have the feature
# a100, for a site template's --constraint.
MULTINODE_SLURM = {
    "KLIQUE_SLURM_DIR": "/tmp/klique-slurm-nodes",
    "KLIQUE_SLURM_CTLD_PORT": "7017",
    "KLIQUE_SLURM_SLURMD_PORT": "7021",
    "KLIQUE_SLURM_CLUSTER": "nodes",
    "KLIQUE_SLURM_NODES": "2",
    "KLIQUE_SLURM_NODE_FEATURES": "a100",
}


@pytest.fixture(scope="session")
def multinode_slurm_cluster(test_users: tuple[str, str]) -> Iterator[SlurmCluster]:
    """A private cluster of two nodes, n1 and n2 (use its `conf` as SLURM_CONF); stopped at
    the end of the session, its state kept."""
    yield from private_cluster(MULTINODE_SLURM)


def private_cluster(settings: dict[str, str]) -> Iterator[SlurmCluster]:
    """A private cluster of scripts/slurm-up with these settings, stopped at the end."""
    env = dict(settings)
    run_script("slurm-up", env=env)
    folder = Path(env["KLIQUE_SLURM_DIR"])
    yield SlurmCluster(
        folder, folder / "etc/slurm.conf", folder / "work", folder / "log/jobcomp.txt"
    )
    run_script("slurm-down", env=env)


# A third private cluster whose accounting is slurmdbd with MariaDB (both Debian's), as most
# sites run it, and whose controller forgets a finished job after 2 s (MinJobAge), so that
# what Klique learns of an ended job comes from slurmdbd.
ACCOUNTING_SLURM = {
    "KLIQUE_SLURM_DIR": "/tmp/klique-slurm-accounting",
    "KLIQUE_SLURM_CTLD_PORT": "7117",
    "KLIQUE_SLURM_SLURMD_PORT": "7118",
    "KLIQUE_SLURM_DBD_PORT": "7119",
    "KLIQUE_SLURM_DB_PORT": "33079",
    "KLIQUE_SLURM_CLUSTER": "accounting",
    "KLIQUE_SLURM_MIN_JOB_AGE": "2",
}


@pytest.fixture(scope="session")
def accounting_slurm_cluster(test_users: tuple[str, str]) -> Iterator[SlurmCluster]:
    """A private cluster with slurmdbd accounting and MinJobAge=2 (use its `conf` as
    SLURM_CONF); stopped at the end of the session, its state kept."""
    env = dict(ACCOUNTING_SLURM)
    run_script("slurm-up", "--accounting", env=env)
    folder = Path(env["KLIQUE_SLURM_DIR"])
    yield SlurmCluster(
        folder, folder / "etc/slurm.conf", folder / "work", folder / "log/jobcomp.txt"
    )
    run_script("slurm-down", env=env)


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


@dataclass(frozen=True)
class Podman:
    image: str  # a Python image in podman's local store
    run_args: tuple[str, ...]  # what podman needs on this kind of machine
    gpu_device: str  # a CDI device kind whose devices 0 and 1 are fake GPUs


# Podman on a VM whose cgroups are hybrid and whose hard nofile limit is low needs runc and
# explicit limits (crun and podman's default limits fail there).
PODMAN_RUN_ARGS = (
    "--runtime=/usr/sbin/runc",
    "--ulimit=nofile=1024:1024",
    "--ulimit=nproc=1000:1000",
)
FAKE_GPU_KIND = "klique.test/gpu"
# A CDI spec (github.com/cncf-tags/container-device-interface, SPEC.md, version 0.5.0) for two
# GPUs that are not there: each sets a variable naming itself, as a real spec adds device nodes.
FAKE_GPU_SPEC = f"""cdiVersion: "0.5.0"
kind: {FAKE_GPU_KIND}
devices:
  - name: "0"
    containerEdits:
      env: ["KLIQUE_FAKE_GPU=0"]
  - name: "1"
    containerEdits:
      env: ["KLIQUE_FAKE_GPU=1"]
"""


@pytest.fixture(scope="session")
def podman() -> Podman:
    """Podman with the tests' Python image (built once, tests/helpers/container_images.py) and a CDI
    spec of fake GPUs in /var/run/cdi, one of podman's CDI folders."""
    if not services_on():
        pytest.skip(skip_reason("podman"))
    binary = shutil.which("podman")
    if binary is None or os.geteuid() != 0:
        message = "needs podman (scripts/apt-deps installs it) and root, as the server runs"
        if os.environ.get("KLIQUE_REQUIRE_SERVICES") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    image = podman_image(binary)
    cdi = Path("/var/run/cdi")
    cdi.mkdir(parents=True, exist_ok=True)
    (cdi / "klique-test-gpus.yaml").write_text(FAKE_GPU_SPEC)
    return Podman(image, PODMAN_RUN_ARGS, FAKE_GPU_KIND)


# A host pool in docker mode for the podman tests: `$JOB_ROOT` is made by server_factory.
DOCKER_ESTATE = """
resources:
  cpu:
    profile: {{cpus: 1, memory: 1G, walltime: 1h, pools: [box]}}
  short:
    profile: {{cpus: 1, memory: 1G, walltime: 3s, pools: [box]}}
  half-gpu:
    profile: {{gpu_fraction: 0.5, cpus: 1, memory: 1G, walltime: 1h, pools: [box]}}
pools:
  box:
    kind: host
    slots: 8
    gpus: 1
    gpu_memory: 40G
    mode: docker
    runtime: podman
    gpu_device: {gpu_device}
    run_args: {run_args}
    user_map: {{admin: alice, alice: alice, bob: bob}}
    job_root: $JOB_ROOT
"""


def docker_estate(podman: Podman, pool: str) -> str:
    """The estate with its pool named `pool`: a name of the test's own, so that the containers it
    lists by their pool's label are its own (other tests' servers number their tasks from 1)."""
    text = DOCKER_ESTATE.format(gpu_device=podman.gpu_device, run_args=list(podman.run_args))
    return text.replace("box", pool)
