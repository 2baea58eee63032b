"""The sudo transport of a login-node agent: a service account that submits as users through
`sudo -n -u`, with a real sudoers rule that names the scheduler's commands and one helper
program; the helper does exactly what the shell scripts of the other transports do."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, start_server, stop_server
from helpers.batch import open_folder, remove_tree, shared_folder
from helpers.confined import write_config

from broker import fileops
from broker.errors import CommandFailed
from broker.transport import JobFolder, LocalTransport, SudoTransport

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="sudoers and accounts need root"),
]

SERVICE = "klique-svc"
HELPER = Path("/usr/local/libexec/klique-helper")
SUDOERS = Path("/etc/sudoers.d/klique-test")
CONFIG = Path("/etc/klique/helper.conf")  # where an installed helper reads its job roots
SCHEDULER = ("sbatch", "squeue", "scancel", "sinfo", "sacct")


@pytest.fixture(scope="module")
def jobs(test_users: Any) -> Iterator[Path]:
    """A job root for these tests, open to all (sticky), in a folder of its own."""
    folder = shared_folder("klique-sudo-")
    try:
        yield open_folder(folder / "jobs")
    finally:
        remove_tree(folder)


@pytest.fixture(scope="module")
def sudo_rule(test_users: Any, slurm_cluster: Any, jobs: Path) -> Iterator[str]:
    """The service account, the helper installed root-owned with its job roots (these tests'
    and the cluster's shared folder), and its sudoers rule."""
    if subprocess.run(["id", SERVICE], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--create-home", SERVICE], check=True)
    subprocess.run(
        [str(ROOT / ".venv" / "bin" / "klique"), "agent", "--install-helper", str(HELPER)],
        check=True,
        capture_output=True,
    )
    os.chown(HELPER, 0, 0)
    kept = CONFIG.read_bytes() if CONFIG.exists() else None
    write_config(CONFIG, [jobs, slurm_cluster.work])
    programs = ", ".join(shutil.which(p) or f"/usr/bin/{p}" for p in SCHEDULER)
    # As docs/login-node-agent.md writes it: the commands named, their environment reset.
    rule = (
        f"Cmnd_Alias KLIQUE = {programs}, {HELPER}\n"
        'Defaults!KLIQUE env_reset, env_keep = "SLURM_CONF", !setenv, '
        'secure_path = "/usr/local/bin:/usr/bin:/bin"\n'
        f"{SERVICE} ALL=(alice,bob) NOPASSWD: NOSETENV: KLIQUE\n"
    )
    staged = SUDOERS.with_suffix(".new")
    staged.write_text(rule)
    staged.chmod(0o440)
    subprocess.run(["visudo", "-c", "-f", str(staged)], check=True, capture_output=True)
    staged.replace(SUDOERS)
    yield rule
    SUDOERS.unlink(missing_ok=True)
    if kept is None:
        CONFIG.unlink()
    else:
        CONFIG.write_bytes(kept)


def as_service(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["runuser", "-u", SERVICE, "--", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_the_rule_gives_no_shell_and_never_root(sudo_rule: str, jobs: Path) -> None:
    for argv in (
        ["sudo", "-n", "-u", "root", "/usr/bin/squeue"],
        ["sudo", "-n", "-u", "alice", "/bin/sh", "-c", "id"],
        ["sudo", "-n", "-u", "alice", "/usr/bin/env", "id"],
        # no variable of the caller's: sudo's VAR=value is refused (NOSETENV, !setenv)
        ["sudo", "-n", "-u", "alice", "PYTHONINSPECT=1", str(HELPER), "mode", str(jobs)],
    ):
        done = as_service(*argv)
        assert done.returncode != 0, argv
    # The helper runs only a scheduler's submit command after writing a job folder.
    folder = f"{jobs}/klique-sudo-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [
            "runuser",
            "-u",
            SERVICE,
            "--",
            "sudo",
            "-n",
            "-u",
            "alice",
            str(HELPER),
            "unpack",
            folder,
            "/bin/sh",
            "-c",
            "id",
        ],
        input=fileops.tar_of({"job.sh": (b"true\n", 0o700)}),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 126 and b"runs only sbatch, qsub, bsub" in done.stderr
    assert Path(folder).stat().st_uid == pwd.getpwnam("alice").pw_uid
    remove_tree(Path(folder))


def test_through_the_rule_the_helper_stays_in_its_job_roots(sudo_rule: str) -> None:
    """sudo to alice reaches her files through the helper only inside the job roots of its
    configuration: her .profile is refused, with the reason on one line."""
    profile = str(Path(pwd.getpwnam("alice").pw_dir) / ".profile")
    done = as_service("sudo", "-n", "-u", "alice", str(HELPER), "read", profile, "1", "4096")
    assert (done.returncode, done.stdout) == (4, ""), done
    assert "outside the job roots" in done.stderr and len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize("transport", ["scripts", "helper"])
def test_the_helper_does_what_the_scripts_do(sudo_rule: str, jobs: Path, transport: str) -> None:
    """Each file operation, as alice, through the shell scripts (runuser) and through the
    helper (sudo from root): the same results."""
    chosen = LocalTransport() if transport == "scripts" else SudoTransport(str(HELPER))
    root = open_folder(jobs / f"klique-ops-{transport}-{uuid.uuid4().hex[:8]}")

    async def scenario() -> dict[str, Any]:
        folder = f"{root}/job"
        files = {"task.json": (b'{"id": 1}', 0o600), "job.sh": (b"#!/bin/sh\n", 0o700)}
        shown = await chosen.write_files(
            folder, files, account="alice", then=["sbatch", "--version"]
        )
        try:
            await chosen.write_files(folder, files, account="alice")
            reused = True
        except CommandFailed:
            reused = False
        await chosen.write_file(f"{folder}/console.log", b"0123456789", account="alice")
        (Path(folder) / "link").symlink_to("/etc/shadow")
        found = await chosen.read_files(
            [f"{folder}/task.json", f"{folder}/missing", f"{folder}/link"], account="alice"
        )
        await chosen.private_dir(f"{root}/cache", account="alice")
        elements = [JobFolder(f"{root}/klique-1-1-00000000000{n}", files, ()) for n in (1, 2)]
        made = await chosen.write_folders(elements, account="alice")
        again = await chosen.write_folders(elements[1:], account="alice")
        return {
            "elements": [o is None for o in made] + [type(o).__name__ for o in again],
            "element_modes": sorted(
                (p.name, oct(p.stat().st_mode & 0o777)) for p in Path(elements[1].folder).iterdir()
            ),
            "then": (shown.returncode, shown.stdout.split()[0]),
            "reused": reused,
            "read": await chosen.read_file(
                f"{folder}/console.log", account="alice", offset=3, limit=4
            ),
            "missing": await chosen.read_file(f"{folder}/nothing", account="alice"),
            "files": sorted(found.items()),
            "mode": oct(await chosen.mode(folder, account="alice")),
            "executable": [
                await chosen.executable(f"{folder}/job.sh", account="alice"),
                await chosen.executable(f"{folder}/task.json", account="alice"),
            ],
            "modes": sorted(
                (p.name, oct(p.stat().st_mode & 0o777))
                for p in Path(folder).iterdir()
                if not p.is_symlink()
            ),
            "cache": oct(Path(f"{root}/cache").stat().st_mode & 0o777),
        }

    try:
        got = asyncio.run(scenario())
    finally:
        remove_tree(root)
    assert got == {
        "elements": [True, True, "CommandFailed"],
        "element_modes": [("job.sh", "0o700"), ("task.json", "0o600")],
        "then": (0, "slurm-wlm"),
        "reused": False,
        "read": b"3456",
        "missing": None,
        "files": [(f"{root}/job/task.json", b'{"id": 1}')],
        "mode": "0o700",
        "executable": [True, False],
        "modes": [("console.log", "0o644"), ("job.sh", "0o700"), ("task.json", "0o600")],
        "cache": "0o700",
    }


def test_a_remote_agent_as_a_service_account_runs_tasks_as_their_owners(
    sudo_rule: str, slurm_cluster: Any, installed_klique: Path, tmp_path: Path
) -> None:
    """The control plane, and `klique agent` run as the service account from an installed
    Klique with `transport: {kind: sudo}`: alice's and bob's tasks run as alice and bob."""
    job_root = open_folder(slurm_cluster.work / f"sudo-{uuid.uuid4().hex[:8]}")
    estate = tmp_path / "estate.yaml"
    estate.write_text(
        f"""
resources:
  cpu:
    profile: {{cpus: 1, memory: 100M, walltime: 10m, pools: [hpc]}}
pools:
  hpc:
    kind: slurm
    agent: remote
    partition: debug
    job_root: {job_root}
    python: /usr/bin/python3
    poll_interval: 1s
    accounting: jobcomp
    transport: {{kind: sudo, helper: {HELPER}}}
    user_map: {{alice: alice, bob: bob}}
"""
    )
    server = start_server(tmp_path / "home", estate)
    agent_home = Path(f"/tmp/klique-agent-{uuid.uuid4().hex[:8]}")
    agent = None
    try:
        with server.api() as api:
            token = api.post("/agent-tokens", json={"pools": ["hpc"]}).json()["token"]
        agent_home.mkdir(mode=0o700)
        shutil.chown(agent_home, SERVICE, SERVICE)
        token_file = agent_home / "agent.token"
        token_file.write_text(token)
        shutil.chown(token_file, SERVICE, SERVICE)
        token_file.chmod(0o600)
        env = {"KLIQUE_HOME": str(agent_home / "home"), "SLURM_CONF": str(slurm_cluster.conf)}
        agent = subprocess.Popen(
            [
                "runuser",
                "-u",
                SERVICE,
                "--",
                "env",
                *(f"{k}={v}" for k, v in env.items()),
                str(installed_klique / "klique"),
                "agent",
                "--pool",
                "hpc",
                "--server",
                server.url,
                "--token-file",
                str(token_file),
            ],
            stdout=(tmp_path / "agent.log").open("wb"),
            stderr=subprocess.STDOUT,
            cwd="/",
        )
        ids = {}
        for user in ("alice", "bob"):
            user_token = server.make_token(user)
            with server.api(user_token) as api:
                answer = api.post("/tasks", json={"command": ["id", "-un"]}).json()
            ids[user] = (answer["id"], user_token)
        for user, (task_id, user_token) in ids.items():
            task = server.wait_state(task_id, token=user_token, timeout=120)
            assert task["state"] == "completed", (task, (tmp_path / "agent.log").read_text())
            logs = server.cli("logs", str(task_id), token=user_token).output
            assert logs.strip().endswith(user), logs
            assert Path(task["job_dir"]).stat().st_uid == pwd.getpwnam(user).pw_uid
        pools = json.loads(server.cli("pools", "--json").output)
        assert pools[0]["reachable"] and pools[0]["last_good"], pools
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(30)
        stop_server(server)
        remove_tree(job_root)
        remove_tree(agent_home)


def test_the_agent_token_serves_its_pools_only(host_server: Any) -> None:
    with host_server.api() as api:
        refused = api.post("/agent-tokens", json={"pools": ["local"]})
    assert refused.status_code == 404 and "agent: remote" in refused.json()["detail"]


def test_the_helper_submits_many_job_folders_as_the_scripts_do(sudo_rule: str, jobs: Path) -> None:
    from helpers.submit_many import expected, run_scenario

    assert run_scenario(SudoTransport(str(HELPER)), jobs) == expected()
