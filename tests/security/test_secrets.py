"""The server's own files are private from their first byte, tokens are kept as digests, and
the smaller holes (SSH without known_hosts, `~`, git options in a repository) stay shut."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import HOST_ACCESS, wait_for
from helpers.runner import make_job, run_runner

from broker.errors import TransportError
from broker.estate import parse_estate
from broker.pools.login import make_transport
from broker.pools.registry import settings_for
from broker.transport_ssh import SSHTransport

from .conftest import RESOURCE, Attack, as_account, submit


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_servers_files_are_its_own_and_hold_no_token_in_clear(attack_factory) -> None:
    attack: Attack = attack_factory("host")
    server = attack.server
    task_id = submit(attack, attack.alice, "echo hi")
    task = server.wait_state(task_id, token=attack.alice)
    assert mode(server.home) == 0o700
    for name in ("klique.db", "admin.token", "server.json"):
        assert mode(server.home / name) == 0o600, name
    peek = as_account("bob", "cat", str(server.home / "klique.db"))
    assert peek.returncode != 0 and "Permission denied" in peek.stderr
    report_token = json.loads((Path(task["job_dir"]) / "task.json").read_text())["report"]["token"]
    stored = b"".join(p.read_bytes() for p in server.home.glob("klique.db*"))
    for secret in (report_token, server.token, attack.alice, attack.bob):
        assert secret.encode() not in stored


def test_the_cli_keeps_its_token_private(host_server) -> None:
    done = host_server.cli("login", "--token", host_server.token)
    assert done.exit_code == 0, done.output
    assert mode(Path(host_server.env()["KLIQUE_HOME"]) / "credentials.json") == 0o600


def test_an_ssh_pool_needs_known_hosts_and_expands_home() -> None:
    text = RESOURCE + "pools:\n  p: {kind: slurm, job_root: /tmp, transport: {kind: ssh}}\n"
    with pytest.raises(Exception, match="needs known_hosts"):
        parse_estate(text)
    estate = parse_estate(
        RESOURCE + "pools:\n  p: {kind: slurm, job_root: /tmp, user_map: {a: alice}, "
        "transport: {kind: ssh, known_hosts: ~/.ssh/known_hosts, client_keys: [~/.ssh/id]}}\n"
    )
    transport = make_transport(estate.pools["p"])
    assert isinstance(transport, SSHTransport)
    assert transport._known_hosts == str(Path("~/.ssh/known_hosts").expanduser())
    assert transport._client_keys == [str(Path("~/.ssh/id").expanduser())]
    pool = estate.pools["p"]
    broken = type(pool)(
        name="q", kind="slurm", settings=settings_for("slurm", transport={"kind": "ssh"})
    )
    with pytest.raises(TransportError, match="needs known_hosts"):
        make_transport(broken)


def test_a_repository_that_looks_like_an_option_never_reaches_git_as_one(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    job = make_job(
        tmp_path,
        command=["true"],
        code={"repo": f"--upload-pack=touch {marker}", "commit": "a" * 40},
    )
    run_runner(job)
    exit_doc = json.loads((job / "exit.json").read_text())
    assert exit_doc["outcome"] == "setup_failed" and not marker.exists()


def test_a_mapped_pool_needs_a_shared_job_root(server_factory) -> None:
    text = RESOURCE + "pools:\n  p: {kind: host, user_map: {alice: alice}}\n"
    with pytest.raises(Exception, match="a host pool with a user_map needs job_root"):
        parse_estate(text)
    loose = subprocess.run(["mktemp", "-d"], capture_output=True, text=True, check=True)
    folder = Path(loose.stdout.strip())
    folder.chmod(0o777)  # writable by all, without the sticky bit
    estate = RESOURCE + f"pools:\n  p:\n    kind: host\n    {HOST_ACCESS}\n".replace(
        "$JOB_ROOT", str(folder)
    )
    server = server_factory(estate)

    def refused() -> bool:
        pool = json.loads(server.cli("pools", "--json").output)[0]
        return not pool["reachable"] and "without the sticky bit" in pool["reason"]

    wait_for(refused, 30, "the pool to refuse its job root")
    folder.rmdir()
