"""Run argv as a pool's mapped Linux account, and move bytes into and out of its folders: on this
host (runuser, sudo, or the sudo helper) here, or over SSH (broker/transport_ssh.py). With that
module, the only place in the broker that runs processes; it knows nothing of submission."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import posixpath
import pwd
import re
import shlex
import signal
import socket
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from broker import fileops
from broker.errors import CommandFailed, KliqueError, NotPermitted, TransportError

# POSIX portable user names (at most 32 characters, as shadow-utils allows).
_ACCOUNT = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The broker's own environment (database URLs, tokens) must not reach users' commands.
_PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "SLURM_CONF", "PBS_CONF_FILE", "LSF_ENVDIR")
Env = Mapping[str, str] | None


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class JobFolder:
    """One item of `Transport.write_and_submit_many` (or, without a command, of
    `write_folders`): a new folder, its files (name -> (data, mode)), and the submit command to
    run after writing them (its stdin the folder's file `then_stdin`, if given)."""

    folder: str
    files: Mapping[str, tuple[bytes, int]]
    then: Sequence[str]
    then_stdin: str | None = None


# One submit-each command runs at most this many submissions; one unpack-each command makes at
# most FOLDERS_AT_ONCE folders, or about BATCH_BYTES of files.
BATCH_ITEMS = 64
FOLDERS_AT_ONCE = 1000
BATCH_BYTES = 16 << 20


def check_account(account: str) -> None:
    """Refuse an account Klique must not run as on this host."""
    host = socket.gethostname()
    check_name(account)
    try:
        entry = pwd.getpwnam(account)
    except KeyError:
        raise NotPermitted(
            f"Linux account '{account}' does not exist on {host}; "
            "map the user to an existing account in the estate's user_map"
        ) from None
    if entry.pw_uid == 0:
        raise NotPermitted(root_refusal(account, host))


def check_name(account: str) -> None:
    if not _ACCOUNT.fullmatch(account):
        raise NotPermitted(
            f"{account!r} is not a valid Linux account name (letters, digits, '_', '.', '-'; "
            "at most 32; not starting with a digit or '-'); fix the estate's user_map"
        )


def root_refusal(account: str, host: str) -> str:
    return (
        f"Linux account '{account}' resolves to uid 0 (root) on {host}; Klique never submits "
        "as root: map the user to an ordinary account in the estate's user_map"
    )


def shown(argv: Sequence[str]) -> str:
    text = shlex.join(argv)
    return text if len(text) <= 200 else text[:197] + "..."


def timed_out(argv: Sequence[str], account: str, host: str, timeout: float) -> TransportError:
    return TransportError(
        f"`{shown(argv)}` as {account} on {host} did not finish within {timeout:g} s; killed"
    )


def with_env(argv: Sequence[str], env: Env, clean: bool = False) -> list[str]:
    """argv behind `env`, which sets the variables (only those, when clean) and exits 127/126
    like a shell when the program is missing or not executable."""
    if not argv:
        raise TransportError("an empty command cannot be run")
    bad = [name for name in env or () if not _ENV_NAME.fullmatch(name)]
    if bad:
        raise TransportError(f"invalid environment variable names {bad!r} for `{shown(argv)}`")
    if "=" in argv[0]:
        raise TransportError(f"a program name containing '=' cannot be run: {argv[0]!r}")
    variables = [f"{k}={v}" for k, v in (env or {}).items()]
    return ["env", *(["-i"] if clean else []), "--", *variables, *argv]


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise TransportError(f"path {path!r} must be absolute")
    return path


def _plain(folder: str, files: Mapping[str, tuple[bytes, int]]) -> str:
    """The folder, absolute, once its files' names are plain names inside it."""
    bad = [name for name in files if not fileops.FILE_NAME.fullmatch(name)]
    if bad:
        raise TransportError(f"file names {bad!r} must be plain names inside {folder}")
    return _absolute(folder)


def _not_a_job_folder(folder: str) -> CommandFailed:
    return CommandFailed(
        f"{folder!r} is not a job folder as Klique names them (an absolute path of plain "
        "names, ending in klique-ID-ATTEMPT-HEX); nothing was written"
    )


def _chunks(indices: Sequence[int], items: Sequence[JobFolder]) -> list[list[int]]:
    """These indices of items in runs of at most FOLDERS_AT_ONCE items or about BATCH_BYTES."""
    chunks: list[list[int]] = []
    size = 0
    for index in indices:
        length = sum(len(data) for data, _mode in items[index].files.values())
        if not chunks or len(chunks[-1]) >= FOLDERS_AT_ONCE or size + length > BATCH_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(index)
        size += length
    return chunks


def _item_lines(stdout: str) -> dict[int, Completed]:
    """submit-each's or unpack-each's answer: each item's exit code and output
    (fileops.ITEM_LINE)."""
    found: dict[int, Completed] = {}
    for line in stdout.splitlines():
        match = fileops.ITEM_LINE.fullmatch(line)
        if match:
            out, err = (base64.b64decode(match[n]).decode(errors="replace") for n in (3, 4))
            found[int(match[1])] = Completed(int(match[2]), out, err)
    return found


class Transport(ABC):
    """Runs argv as an account and moves files as that account; subclasses say where."""

    host: str
    default_account: str | None = None  # for reading files when no account is named
    commands = 0  # how many commands this transport has run (each one process or session)

    async def run(
        self,
        argv: Sequence[str],
        *,
        account: str,
        stdin: bytes | None = None,
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> Completed:
        raw = await self._call(argv, account, stdin, timeout, env)
        return Completed(raw.returncode, raw.out.decode(errors="replace"), raw.err)

    def op(self, name: str, *args: str) -> list[str]:
        """The argv of one file operation (broker/fileops.py): a shell script by default."""
        return ["sh", "-c", fileops.SCRIPTS[name], "sh", *args]

    async def write_file(self, path: str, data: bytes, *, account: str, mode: int = 0o644) -> None:
        """Write atomically (a temporary name in the same folder, then rename), owned by account."""
        argv = self.op("write", _absolute(path), f"{mode:o}")
        done = await self.run(argv, account=account, stdin=data)
        if done.returncode:
            raise CommandFailed(
                f"could not write {path} as {account} on {self.host}: {done.stderr.strip()}"
            )

    async def write_files(
        self,
        folder: str,
        files: Mapping[str, tuple[bytes, int]],
        *,
        account: str,
        then: Sequence[str] = (),
        then_stdin: str | None = None,
        timeout: float = 60.0,
    ) -> Completed:
        """Make `folder` (new), write `files` (name -> (data, mode)) into it, then run `then` if
        given (its stdin the file `then_stdin` of the folder), all as account in one command:
        one process (or SSH session) instead of one per step.

        Returns how `then` ended; raises CommandFailed when the files could not be written.
        """
        folder = _plain(folder, files)
        extra = [f"--stdin={folder}/{then_stdin}"] if then and then_stdin else []
        argv = self.op("unpack", folder, *extra, *then)
        done = await self.run(argv, account=account, stdin=fileops.tar_of(files), timeout=timeout)
        return self._unpacked(folder, files, account, done, bool(then))

    def _unpacked(
        self,
        folder: str,
        files: Mapping[str, tuple[bytes, int]],
        account: str,
        done: Completed,
        then: bool,
    ) -> Completed:
        """How an unpack ended; CommandFailed when the files could not be written."""
        words = fileops.UNPACK_WORDS
        unpacked = not (
            done.returncode == fileops.UNPACK_FAILED and done.stderr.rstrip().endswith(words)
        )
        if not unpacked or (done.returncode and not then):
            words = done.stderr.strip().removesuffix(words).strip()
            raise CommandFailed(
                f"could not write {', '.join(files)} into {folder} as {account} on {self.host}: "
                f"{words or f'exit {done.returncode}'}"
            )
        return done

    async def write_and_submit_many(
        self, items: Sequence[JobFolder], *, account: str, timeout: float = 60.0
    ) -> list[Completed | KliqueError]:
        """Each item as `write_files` does it, as account: the folders as `write_folders` makes
        them, then the commands of those made, one of the submit programs each, in one command
        per BATCH_ITEMS (submit-each). Items are independent; one outcome per item, in order:
        how its command ended, CommandFailed (its folder could not be made or written), or
        TransportError when a command as a whole failed (a timeout, a lost connection: whether
        the item's command ran is unknown)."""
        bare = [replace(item, then=(), then_stdin=None) for item in items]
        results: dict[int, Completed | KliqueError] = {}
        made = await self.write_folders(bare, account=account, timeout=timeout)
        ready: list[int] = []
        for n, (item, fault) in enumerate(zip(items, made, strict=True)):
            if fault is not None:
                results[n] = fault
            elif item.then:
                ready.append(n)
            else:
                results[n] = Completed(0, "", "")
        for start in range(0, len(ready), BATCH_ITEMS):
            chunk = ready[start : start + BATCH_ITEMS]
            answers = await self._submit_each([items[n] for n in chunk], account, timeout)
            results.update(zip(chunk, answers, strict=True))
        return [results[n] for n in range(len(items))]

    async def write_folders(
        self, folders: Sequence[JobFolder], *, account: str, timeout: float = 60.0
    ) -> list[KliqueError | None]:
        """Each folder new with its files, as account, and no command (an array's elements): one
        command (unpack-each: one mkdir and one tar) for the folders that share a parent, up to
        FOLDERS_AT_ONCE or about BATCH_BYTES. One outcome per folder, in order: None
        (written), CommandFailed (its name existed, or could not be made or written), or
        TransportError (the command as a whole failed)."""
        results: dict[int, KliqueError | None] = {}
        parents: dict[str, list[int]] = {}
        for n, item in enumerate(folders):
            if item.then:
                raise ValueError(f"write_folders runs no command: {item.folder} has {item.then}")
            if not fileops.JOB_FOLDER.fullmatch(item.folder):
                results[n] = _not_a_job_folder(item.folder)
            else:
                parents.setdefault(posixpath.dirname(_plain(item.folder, item.files)), []).append(n)
        for parent, indices in parents.items():
            for chunk in _chunks(indices, folders):
                items = [folders[n] for n in chunk]
                made = await self._unpack_each(parent, items, account, timeout)
                results.update(zip(chunk, made, strict=True))
        return [results[n] for n in range(len(folders))]

    async def _unpack_each(
        self, parent: str, folders: Sequence[JobFolder], account: str, timeout: float
    ) -> list[KliqueError | None]:
        names = [posixpath.basename(item.folder) for item in folders]
        files = {
            f"{name}/{file}": data
            for name, item in zip(names, folders, strict=True)
            for file, data in item.files.items()
        }
        argv = self.op("unpack-each", parent, *names)
        tar = fileops.tar_of(files)
        try:
            done = await self.run(argv, account=account, stdin=tar, timeout=timeout)
        except KliqueError as exc:
            return [exc] * len(folders)
        made = {index: found.returncode for index, found in _item_lines(done.stdout).items()}
        if done.returncode or len(made) != len(folders):
            words = done.stderr.strip().removesuffix(fileops.UNPACK_WORDS).strip()
            failed = CommandFailed(
                f"could not write {len(folders)} job folders into {parent} as {account} on "
                f"{self.host}: {words or f'exit {done.returncode}'}; fix: let {account} make "
                f"folders in {parent} (the pool's job_root), with space left there"
            )
            return [failed] * len(folders)
        return [
            None
            if made[index] == 0
            else CommandFailed(
                f"could not make {item.folder} as {account} on {self.host}: the name exists "
                f"already, or {parent} is not writable by {account}; nothing was written"
            )
            for index, item in enumerate(folders)
        ]

    async def _submit_each(
        self, items: Sequence[JobFolder], account: str, timeout: float
    ) -> list[Completed | KliqueError]:
        words: list[str] = []
        for item in items:
            extra = [f"--stdin={item.folder}/{item.then_stdin}"] if item.then_stdin else []
            words += [str(len(extra) + len(item.then)), *extra, *item.then]
        try:
            done = await self.run(self.op("submit-each", *words), account=account, timeout=timeout)
        except KliqueError as exc:
            return [exc] * len(items)
        found = _item_lines(done.stdout)
        return [
            found.get(index)
            or TransportError(
                f"submitting {len(items)} job folders as {account} on {self.host} ended before "
                f"{item.folder} (exit {done.returncode}): {done.stderr.strip()}"
            )
            for index, item in enumerate(items)
        ]

    async def make_dir(self, path: str, *, account: str) -> None:
        done = await self.run(self.op("mkdir", _absolute(path)), account=account)
        if done.returncode:
            raise CommandFailed(
                f"could not make {path} as {account} on {self.host}: {done.stderr.strip()}"
            )

    async def read_file(
        self, path: str, *, account: str | None = None, offset: int = 0, limit: int = 1 << 30
    ) -> bytes | None:
        """Up to `limit` bytes of the file from offset on, read as account; None when it is
        missing (or hidden from account)."""
        account = account or self.default_account
        if account is None:
            raise TransportError(f"reading {path} on {self.host} needs an account")
        argv = self.op("read", _absolute(path), str(offset + 1), str(limit))
        done = await self._call(argv, account, None, 60.0, None)
        if done.returncode == fileops.MISSING:
            return None
        if done.returncode:
            raise TransportError(f"could not read {path} as {account} on {self.host}: {done.err}")
        return done.out

    async def read_files(self, paths: Sequence[str], *, account: str) -> dict[str, bytes]:
        """The regular files among `paths`, read as account in one command; missing files,
        links and anything else are left out."""
        if not paths:
            return {}
        argv = self.op("collect", *(_absolute(p) for p in paths))
        done = await self._call(argv, account, None, 60.0, None)
        if done.returncode:
            raise TransportError(
                f"could not read {len(paths)} files as {account} on {self.host}: {done.err}"
            )
        return fileops.untar(done.out)

    async def private_dir(self, path: str, *, account: str) -> None:
        """Make `path` a folder of account's own (mode 700), or refuse what is already there."""
        done = await self.run(self.op("private-dir", _absolute(path)), account=account)
        if done.returncode:
            raise CommandFailed(
                f"{path} on {self.host} is not a private folder of {account} (it is a link, or "
                "owned by another account); fix: remove it, and never share it between accounts"
            )

    async def mode(self, path: str, *, account: str) -> int:
        """The permission bits of `path` as account sees them (links followed)."""
        done = await self.run(self.op("mode", _absolute(path)), account=account, timeout=30)
        if done.returncode or not done.stdout.strip().isdigit():
            raise CommandFailed(
                f"{path} cannot be used by {account} on {self.host}: {done.stderr.strip()}"
            )
        return int(done.stdout.strip(), 8)

    async def executable(self, path: str, *, account: str) -> bool:
        done = await self.run(self.op("executable", _absolute(path)), account=account)
        return done.returncode == 0

    async def remove(self, path: str, *, account: str) -> None:
        """Remove a file of the account's (not a folder); nothing when it is not there."""
        await self.run(self.op("remove", _absolute(path)), account=account, timeout=30)

    async def signal(self, targets: Sequence[str], sig: str, *, account: str) -> None:
        """Send a signal as account: its kernel rights decide which processes it reaches.
        Targets are pids, or -PGID for a whole process group."""
        argv = ["kill", f"-{sig}", "--", *targets]
        await self.run(argv, account=account, timeout=30.0)

    async def close(self) -> None:
        return None

    async def _call(
        self, argv: Sequence[str], account: str, stdin: bytes | None, timeout: float, env: Env
    ) -> RawResult:
        self.commands += 1
        return await self._exec(argv, account, stdin, timeout, env)

    @abstractmethod
    async def _exec(
        self, argv: Sequence[str], account: str, stdin: bytes | None, timeout: float, env: Env
    ) -> RawResult: ...


@dataclass(frozen=True)
class RawResult:
    returncode: int
    out: bytes
    err: str


class LocalTransport(Transport):
    """This host: directly as the current user, through runuser as root, else sudo -n."""

    def __init__(self) -> None:
        self.host = socket.gethostname()

    def _as_account(self, account: str) -> list[str]:
        check_account(account)
        if pwd.getpwuid(os.geteuid()).pw_name == account:
            return []
        if os.geteuid() == 0:
            return ["runuser", "-u", account, "--"]
        return ["sudo", "-n", "-u", account, "--"]

    async def spawn(
        self, argv: Sequence[str], *, account: str, env: Mapping[str, str], log: str
    ) -> asyncio.subprocess.Process:
        """Start argv as account in a session of its own, with exactly `env`, its output
        appended to `log` (opened by the account's shell, never by this process); not waited for.
        """
        wrapped = ["sh", "-c", 'log=$1; shift; exec "$@" >>"$log" 2>&1', "sh", _absolute(log)]
        full = [*self._as_account(account), *with_env([*wrapped, *argv], env, clean=True)]
        home = pwd.getpwnam(account).pw_dir
        try:
            return await asyncio.create_subprocess_exec(
                *full,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                env={k: os.environ[k] for k in _PASSED_ENV if k in os.environ},
                cwd=home if os.path.isdir(home) else "/",
                start_new_session=True,
            )
        except OSError as exc:
            raise TransportError(f"cannot run `{shown(full)}` on {self.host}: {exc}") from exc

    def _command(self, argv: Sequence[str], account: str, env: Env) -> tuple[list[str], str]:
        """The full argv that runs `argv` as account, and the folder to start it in."""
        prefix = self._as_account(account)  # refuses an account that does not exist first
        home = pwd.getpwnam(account).pw_dir
        return [*prefix, *with_env(argv, env)], (home if os.path.isdir(home) else "/")

    async def _exec(
        self, argv: Sequence[str], account: str, stdin: bytes | None, timeout: float, env: Env
    ) -> RawResult:
        full, cwd = self._command(argv, account, env)
        try:
            proc = await asyncio.create_subprocess_exec(
                *full,
                stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={k: os.environ[k] for k in _PASSED_ENV if k in os.environ},
                cwd=cwd,
                start_new_session=True,  # so a timeout can kill the whole process group
            )
        except OSError as exc:
            raise TransportError(f"cannot run `{shown(full)}` on {self.host}: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
        except TimeoutError:
            await _kill_group(proc)
            raise timed_out(argv, account, self.host, timeout) from None
        assert proc.returncode is not None
        return RawResult(proc.returncode, out, err.decode(errors="replace"))


class SudoTransport(LocalTransport):
    """This host through `sudo -n -u ACCOUNT`, for an agent that runs as an unprivileged
    service account. Its sudoers rule allows the scheduler's commands and one helper program
    (broker/helper.py) for the file operations, and nothing else: no shell, no `env`."""

    def __init__(self, helper: str) -> None:
        super().__init__()
        self.helper = helper

    def op(self, name: str, *args: str) -> list[str]:
        return [self.helper, name, *args]

    def _as_account(self, account: str) -> list[str]:
        check_account(account)
        return ["sudo", "-n", "-u", account, "--"]

    def _command(self, argv: Sequence[str], account: str, env: Env) -> tuple[list[str], str]:
        if env:
            raise TransportError(
                "a sudo transport passes no environment of its own; set what the scheduler's "
                "commands need in the sudoers rule (env_keep)"
            )
        return [*self._as_account(account), *argv], "/"

    async def spawn(
        self, argv: Sequence[str], *, account: str, env: Mapping[str, str], log: str
    ) -> asyncio.subprocess.Process:
        raise TransportError("host pools start their runners with runuser, not sudo")


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # Root kills the group at once (runuser lingers 2 s after a SIGTERM). A broker without root
    # sends SIGTERM first: sudo relays it to the command, which the broker cannot signal itself.
    signals = (signal.SIGKILL,) if os.geteuid() == 0 else (signal.SIGTERM, signal.SIGKILL)
    for sig in signals:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 2.0)
            return
