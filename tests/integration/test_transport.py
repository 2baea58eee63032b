"""The transport against real accounts, a real sshd on loopback and real processes."""

from __future__ import annotations

import asyncio
import os
import pwd
import socket
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from broker.errors import CommandFailed, NotPermitted, TransportError
from broker.transport import LocalTransport, check_account
from broker.transport_ssh import SSHTransport

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="running as alice and bob through runuser needs root"
)

T = TypeVar("T")

# Arguments a shell would interpret; each must reach the program unchanged. CANARY is replaced by
# a file path that must never come to exist.
HOSTILE = [
    "it's",
    'say "hi"',
    "$(touch CANARY)",
    "`touch CANARY`",
    "a; touch CANARY",
    "x && touch CANARY || touch CANARY",
    "| tee CANARY",
    ">CANARY",
    "line one\nline two\n",
    "$HOME ~ * ? [a-z] {a,b}",
    "back\\slash\\",
    "-n",
    "--",
    "",
    "  spaces  ",
    "tab\there",
    "é ✓ \u00a0",
    "!!",
    "#not a comment",
]

PRINT_ARGV = "import sys; sys.stdout.write(repr(sys.argv[1:]))"


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)
    return value


def hostile(canary: Path) -> list[str]:
    return [arg.replace("CANARY", str(canary)) for arg in HOSTILE]


def process_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def canary() -> Iterator[Path]:
    path = Path(f"/tmp/klique-pwned-{uuid.uuid4().hex}")
    yield path
    assert not path.exists(), f"a hostile argument ran a command: {path} exists"


@pytest.fixture
def home_dir(test_users: tuple[str, str]) -> Iterator[str]:
    """A fresh folder name under alice's home (not created)."""
    path = f"{pwd.getpwnam('alice').pw_dir}/klique-test-{uuid.uuid4().hex[:8]}"
    yield path
    subprocess.run(["rm", "-rf", path], check=True)


def ssh(endpoint: Any, **kwargs: Any) -> SSHTransport:
    return SSHTransport(
        endpoint.host,
        endpoint.port,
        known_hosts=str(kwargs.pop("known_hosts", endpoint.known_hosts)),
        client_keys=[str(endpoint.client_key)],
        **kwargs,
    )


# LocalTransport


def test_local_runs_as_the_account_with_its_uid_and_gid(test_users: tuple[str, str]) -> None:
    async def ids(account: str) -> list[str]:
        uid = await LocalTransport().run(["id", "-u"], account=account)
        gid = await LocalTransport().run(["id", "-g"], account=account)
        assert uid.returncode == gid.returncode == 0, uid.stderr + gid.stderr
        return [uid.stdout.strip(), gid.stdout.strip()]

    for account in test_users:
        entry = pwd.getpwnam(account)
        assert run(ids(account)) == [str(entry.pw_uid), str(entry.pw_gid)]


def test_local_runs_in_the_accounts_home_without_the_brokers_environment(
    test_users: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KLIQUE_DATABASE_PASSWORD", "secret")
    done = run(LocalTransport().run(["sh", "-c", 'pwd; echo "$HOME"; env'], account="bob"))
    home = pwd.getpwnam("bob").pw_dir
    lines = done.stdout.splitlines()
    assert lines[:2] == [home, home]
    assert "KLIQUE_DATABASE_PASSWORD" not in done.stdout


def test_local_write_file_is_atomic_and_owned_by_the_account(home_dir: str) -> None:
    path = f"{home_dir}/sub/task.json"
    old, new = b"a" * (4 << 20), b"b" * (4 << 20)
    seen: set[bytes] = set()

    async def scenario() -> None:
        transport = LocalTransport()
        await transport.make_dir(f"{home_dir}/sub", account="alice")
        await transport.write_file(path, old, account="alice", mode=0o640)
        writer = asyncio.create_task(transport.write_file(path, new, account="alice"))
        while not writer.done():  # read while the new content is being written
            seen.add(await asyncio.to_thread(Path(path).read_bytes))
            await asyncio.sleep(0)
        await writer

    run(scenario())
    alice = pwd.getpwnam("alice")
    info = os.stat(path)
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (alice.pw_uid, alice.pw_gid, 0o644)
    assert os.stat(f"{home_dir}/sub").st_uid == alice.pw_uid
    assert Path(path).read_bytes() == new
    assert seen <= {old, new}, "a reader saw a partly written file"
    assert os.listdir(f"{home_dir}/sub") == ["task.json"], "a temporary file was left behind"


def test_local_write_file_keeps_the_mode_and_reports_failures(home_dir: str) -> None:
    async def scenario() -> None:
        transport = LocalTransport()
        await transport.make_dir(home_dir, account="alice")
        await transport.write_file(
            f"{home_dir}/job.sh", b"#!/bin/sh\n", account="alice", mode=0o755
        )
        with pytest.raises(CommandFailed, match="could not write /root/x as bob"):
            await transport.write_file("/root/x", b"x", account="bob")
        with pytest.raises(TransportError, match="must be absolute"):
            await transport.write_file("relative/x", b"x", account="bob")

    run(scenario())
    assert os.stat(f"{home_dir}/job.sh").st_mode & 0o777 == 0o755


def test_local_read_file_from_an_offset_and_missing_files(home_dir: str) -> None:
    async def scenario() -> list[bytes | None]:
        transport = LocalTransport()
        await transport.make_dir(home_dir, account="alice")
        await transport.write_file(f"{home_dir}/console.log", b"0123456789", account="alice")
        with pytest.raises(TransportError, match="needs an account"):
            await transport.read_file(f"{home_dir}/console.log")  # never with the server's rights
        return [
            await transport.read_file(f"{home_dir}/console.log", account="alice", offset=4),
            await transport.read_file(f"{home_dir}/console.log", account="alice", limit=3),
            await transport.read_file(f"{home_dir}/missing", account="alice"),
        ]

    assert run(scenario()) == [b"456789", b"012", None]


def test_root_missing_and_malformed_accounts_are_refused(
    test_users: tuple[str, str], canary: Path
) -> None:
    with pytest.raises(NotPermitted, match=r"'root' resolves to uid 0 \(root\).*never submits"):
        check_account("root")
    missing = f"nobody{uuid.uuid4().hex[:6]}"
    with pytest.raises(NotPermitted, match=f"'{missing}' does not exist on {socket.gethostname()}"):
        check_account(missing)
    with pytest.raises(NotPermitted, match=f"'{missing}' does not exist"):  # a command as it
        run(LocalTransport().run(["true"], account=missing))
    for name in ["", "-rf", "a b", "$(touch x)", "alice;id", "../alice", "x" * 33, "1abc"]:
        with pytest.raises(NotPermitted, match="not a valid Linux account name"):
            check_account(name)
    with pytest.raises(NotPermitted, match="uid 0"):
        run(LocalTransport().run(["touch", str(canary)], account="root"))
    check_account("alice")


def test_local_hostile_arguments_reach_the_program_unchanged(
    test_users: tuple[str, str], canary: Path
) -> None:
    args = hostile(canary)

    async def scenario() -> list[str]:
        transport = LocalTransport()
        printed = await transport.run(["printf", "%s\\0", *args], account="alice")
        python = await transport.run(["python3", "-c", PRINT_ARGV, *args], account="bob")
        env = await transport.run(
            ["printenv", "HOSTILE"], account="alice", env={"HOSTILE": args[2] + args[8]}
        )
        return [printed.stdout, python.stdout, env.stdout]

    printed, python, env = run(scenario())
    assert printed == "".join(arg + "\0" for arg in args)
    assert python == repr(args)
    assert env == args[2] + args[8] + "\n"


def test_local_stdin_and_exit_status(test_users: tuple[str, str]) -> None:
    async def scenario() -> list[Any]:
        transport = LocalTransport()
        cat = await transport.run(["cat"], account="alice", stdin=b"line\n\x00binary")
        fails = await transport.run(["sh", "-c", "echo oops >&2; exit 3"], account="alice")
        absent = await transport.run(["klique-no-such-program"], account="alice")
        return [cat.stdout, (fails.returncode, fails.stderr), absent.returncode, absent.stderr]

    cat, fails, absent, why = run(scenario())
    assert [cat, fails] == ["line\n\x00binary", (3, "oops\n")]
    # 127 as from a shell; 126 when a directory on the broker's PATH is closed to the account.
    assert absent in (126, 127) and "klique-no-such-program" in why


def test_local_timeout_kills_the_process_and_names_command_and_host(home_dir: str) -> None:
    pid_file = f"{home_dir}/pid"

    async def scenario() -> None:
        transport = LocalTransport()
        await transport.make_dir(home_dir, account="alice")
        script = 'echo $$ > "$1"; exec sleep 300'
        with pytest.raises(TransportError) as caught:
            await transport.run(["sh", "-c", script, "sh", pid_file], account="alice", timeout=1)
        assert "sleep 300" in str(caught.value)
        assert f"on {socket.gethostname()} did not finish within 1 s" in str(caught.value)

    run(scenario())
    pid = int(Path(pid_file).read_text())
    wait_until(lambda: process_gone(pid), 10, f"the timed-out process {pid} to end")


# SSHTransport


@pytest.mark.ssh
def test_ssh_runs_as_each_account_over_one_reused_connection(sshd: Any) -> None:
    async def scenario() -> tuple[dict[str, set[str]], int]:
        transport = ssh(sshd)
        try:
            seen: dict[str, set[str]] = {}
            for account in ("alice", "bob", "alice", "bob"):
                done = await transport.run(["sh", "-c", "id -u; id -g"], account=account)
                seen.setdefault(account, set()).add(done.stdout)
            many = await asyncio.gather(
                *(transport.run(["id", "-un"], account="alice") for _ in range(20))
            )
            assert {done.stdout for done in many} == {"alice\n"}
            return seen, transport.connections_opened
        finally:
            await transport.close()

    seen, opened = run(scenario())
    for account in ("alice", "bob"):
        entry = pwd.getpwnam(account)
        assert seen[account] == {f"{entry.pw_uid}\n{entry.pw_gid}\n"}
    assert opened == 2


@pytest.mark.ssh
def test_ssh_hostile_arguments_reach_the_program_unchanged(sshd: Any, canary: Path) -> None:
    args = hostile(canary)

    async def scenario() -> list[str]:
        transport = ssh(sshd)
        try:
            printed = await transport.run(["printf", "%s\\0", *args], account="alice")
            python = await transport.run(["python3", "-c", PRINT_ARGV, *args], account="bob")
            env = await transport.run(
                ["printenv", "HOSTILE"], account="alice", env={"HOSTILE": args[2] + args[8]}
            )
            cat = await transport.run(["cat"], account="bob", stdin=b"in\x00put")
            return [printed.stdout, python.stdout, env.stdout, cat.stdout]
        finally:
            await transport.close()

    printed, python, env, cat = run(scenario())
    assert printed == "".join(arg + "\0" for arg in args)
    assert python == repr(args)
    assert env == args[2] + args[8] + "\n"
    assert cat == "in\x00put"


@pytest.mark.ssh
def test_ssh_files_are_written_and_read_as_the_account(sshd: Any, home_dir: str) -> None:
    async def scenario() -> list[bytes | None]:
        transport = ssh(sshd, default_account="alice")
        try:
            await transport.make_dir(home_dir, account="alice")
            await transport.write_file(
                f"{home_dir}/exit.json", b'{"exit_code": 0}', account="alice"
            )
            return [
                await transport.read_file(f"{home_dir}/exit.json", offset=2),
                await transport.read_file(f"{home_dir}/absent", account="alice"),
            ]
        finally:
            await transport.close()

    assert run(scenario()) == [b'exit_code": 0}', None]
    assert os.stat(f"{home_dir}/exit.json").st_uid == pwd.getpwnam("alice").pw_uid


@pytest.mark.ssh
def test_ssh_reconnects_after_the_connection_drops(sshd: Any) -> None:
    async def scenario() -> int:
        transport = ssh(sshd)
        try:
            assert (await transport.run(["true"], account="alice")).returncode == 0
            # The command's parent is alice's side of the SSH session: killing it drops the link.
            with pytest.raises(TransportError, match="lost 127.0.0.1"):
                await transport.run(["sh", "-c", "kill -KILL $PPID; sleep 30"], account="alice")
            done = await transport.run(["id", "-un"], account="alice")
            assert done.stdout == "alice\n"
            return transport.connections_opened
        finally:
            await transport.close()

    assert run(scenario()) == 2


@pytest.mark.ssh
def test_ssh_timeout_kills_the_remote_process(sshd: Any, home_dir: str) -> None:
    pid_file = f"{home_dir}/pid"

    async def scenario() -> None:
        transport = ssh(sshd)
        try:
            await transport.make_dir(home_dir, account="alice")
            script = 'echo $$ > "$1"; exec sleep 300'
            with pytest.raises(TransportError, match="as alice on 127.0.0.1:.* within 1 s"):
                await transport.run(
                    ["sh", "-c", script, "sh", pid_file], account="alice", timeout=1
                )
        finally:
            await transport.close()

    run(scenario())
    pid = int(Path(pid_file).read_text())
    wait_until(lambda: process_gone(pid), 10, f"the timed-out remote process {pid} to end")


@pytest.mark.ssh
def test_ssh_refuses_an_unknown_host_key(sshd: Any, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = tmp_path / "known_hosts"
    key = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    wrong.write_text(f"[{sshd.host}]:{sshd.port} {key}\n")
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")

    async def attempt(known_hosts: Path) -> None:
        transport = ssh(sshd, known_hosts=known_hosts)
        try:
            await transport.run(["true"], account="alice")
        finally:
            await transport.close()

    for known_hosts in (wrong, empty):
        with pytest.raises(
            TransportError, match=f"refusing .*host key is not trusted by {known_hosts}"
        ):
            run(attempt(known_hosts))
    with pytest.raises(TransportError, match="known_hosts file .* does not exist"):
        run(attempt(tmp_path / "absent"))


@pytest.mark.ssh
def test_ssh_refuses_root_and_unknown_accounts(sshd: Any) -> None:
    async def attempt(account: str) -> None:
        transport = ssh(sshd)
        try:
            await transport.run(["true"], account=account)
        finally:
            await transport.close()

    with pytest.raises(NotPermitted, match="uid 0"):
        run(attempt("root"))
    with pytest.raises(NotPermitted, match="not a valid Linux account name"):
        run(attempt("-oProxyCommand=touch"))
    with pytest.raises(TransportError, match="refused the login as 'klique-nobody'"):
        run(attempt("klique-nobody"))


def test_ssh_to_a_closed_port_is_a_readable_transport_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens once the socket is closed

    async def attempt(known_hosts: str) -> None:
        transport = SSHTransport("127.0.0.1", port, known_hosts=known_hosts, connect_timeout=5)
        try:
            await transport.run(["true"], account="alice")
        finally:
            await transport.close()

    known_hosts = Path(f"/tmp/klique-known-hosts-{uuid.uuid4().hex}")
    known_hosts.write_text("")
    try:
        with pytest.raises(TransportError, match=f"cannot reach 127.0.0.1:{port} over SSH: .*"):
            run(attempt(str(known_hosts)))
    finally:
        known_hosts.unlink()


def test_local_write_files_makes_the_folder_and_keeps_each_files_mode(home_dir: str) -> None:
    files = {"task.json": (b'{"id": 1}', 0o644), "job.sh": (b"#!/bin/sh\n", 0o755)}

    async def scenario() -> None:
        transport = LocalTransport()
        await transport.make_dir(home_dir, account="alice")  # a job root: it exists already
        folder = f"{home_dir}/klique-1"
        await transport.write_files(folder, files, account="alice")
        with pytest.raises(CommandFailed, match="File exists"):  # a folder is never reused
            await transport.write_files(folder, files, account="alice")
        shown = await transport.write_files(  # a new one, then a command that reads them
            f"{home_dir}/klique-2", files, account="alice", then=["cat", f"{folder}/task.json"]
        )
        assert (shown.returncode, shown.stdout) == (0, '{"id": 1}')
        failed = await transport.write_files(
            f"{home_dir}/klique-3", files, account="alice", then=["false"]
        )
        assert failed.returncode == 1  # the command's failure is the caller's to judge
        with pytest.raises(CommandFailed, match="could not write x into /root/y as bob"):
            await transport.write_files("/root/y", {"x": (b"", 0o644)}, account="bob")
        with pytest.raises(TransportError, match="plain names"):
            await transport.write_files(home_dir, {"../x": (b"", 0o644)}, account="alice")

    run(scenario())
    alice = pwd.getpwnam("alice")
    folder = Path(home_dir) / "klique-1"
    assert sorted(os.listdir(folder)) == ["job.sh", "task.json"]
    assert os.stat(folder).st_mode & 0o777 == 0o700  # private from the first instant
    for name, (data, mode) in files.items():
        info = os.stat(folder / name)
        assert (info.st_uid, info.st_mode & 0o777) == (alice.pw_uid, mode)
        assert (folder / name).read_bytes() == data
    assert os.stat(folder).st_uid == alice.pw_uid


@pytest.mark.parametrize("kind", ["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def test_many_job_folders_are_written_and_submitted_in_one_command(
    request: pytest.FixtureRequest, test_users: tuple[str, str], kind: str
) -> None:
    """Each folder new and private; bob's folder and link fail their own items only; each
    command's output and exit code come back intact, newlines and all."""
    from helpers.submit_many import expected, run_scenario

    transport = LocalTransport() if kind == "local" else ssh(request.getfixturevalue("sshd"))
    assert run_scenario(transport) == expected()


def test_many_job_folders_go_in_bounded_commands(
    home_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from broker import transport as transport_module
    from broker.transport import JobFolder

    monkeypatch.setattr(transport_module, "BATCH_ITEMS", 4)
    local = LocalTransport()
    items = [
        JobFolder(f"{home_dir}/klique-{n}-1-{n:012x}", {"x": (b"", 0o600)}, ["sbatch", "--version"])
        for n in range(9)
    ]

    async def scenario() -> list[Any]:
        await local.make_dir(home_dir, account="alice")
        before = local.commands
        found = await local.write_and_submit_many(items, account="alice")
        return [local.commands - before, [getattr(o, "returncode", o) for o in found]]

    assert run(scenario()) == [4, [0] * 9]  # the folders in one command, the submissions in 3
    assert sorted(os.listdir(home_dir)) == [f"klique-{n}-1-{n:012x}" for n in range(9)]
