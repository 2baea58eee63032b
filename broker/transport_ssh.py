"""A login node over SSH: one pooled connection per (host, port, account), host keys always
checked against known_hosts. The commands and the file operations are those of
broker/transport.py's Transport."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from collections.abc import Sequence

import asyncssh

from broker.errors import NotPermitted, TransportError
from broker.transport import (
    Env,
    RawResult,
    Transport,
    check_name,
    root_refusal,
    shown,
    timed_out,
    with_env,
)


class SSHTransport(Transport):
    """A login node over SSH; host keys are always checked against known_hosts."""

    def __init__(
        self,
        host: str,
        port: int = 22,
        *,
        known_hosts: str,
        client_keys: Sequence[str] = (),
        default_account: str | None = None,
        connect_timeout: float = 15.0,
        max_sessions: int = 8,
    ) -> None:
        self.host = f"{host}:{port}"
        self._address = (host, port)
        self._known_hosts = known_hosts
        self._client_keys = list(client_keys)
        self.default_account = default_account
        self._connect_timeout = connect_timeout
        self._max_sessions = max_sessions  # OpenSSH allows 10 sessions per connection by default
        self._conns: dict[str, asyncssh.SSHClientConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}
        self.connections_opened = 0

    async def close(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()
        for conn in conns:
            await conn.wait_closed()

    async def _exec(
        self, argv: Sequence[str], account: str, stdin: bytes | None, timeout: float, env: Env
    ) -> RawResult:
        # exec: the login shell gives way to the program, so a signal reaches the program.
        command = "exec " + shlex.join(with_env(argv, env))
        async with self._slots.setdefault(account, asyncio.Semaphore(self._max_sessions)):
            conn = await self._connection(account)
            try:
                proc = await conn.create_process(command, encoding=None)
            except (OSError, asyncssh.Error) as exc:
                self._conns.pop(account, None)  # the next call opens a fresh connection
                raise TransportError(
                    f"could not start `{shown(argv)}` as {account} on {self.host}: {_reason(exc)}"
                ) from exc
            with contextlib.suppress(BrokenPipeError):  # it has exited or closed its stdin
                if stdin:
                    proc.stdin.write(stdin)
                proc.stdin.write_eof()
            try:
                out, err = await asyncio.wait_for(proc.communicate(), timeout)
            except TimeoutError:
                with contextlib.suppress(OSError, asyncssh.Error):
                    proc.send_signal("KILL")
                proc.close()
                raise timed_out(argv, account, self.host, timeout) from None
            except (OSError, asyncssh.Error) as exc:
                raise self._lost(argv, account) from exc
        if proc.returncode is None:  # the connection ended before the command did
            raise self._lost(argv, account)
        return RawResult(proc.returncode, bytes(out), bytes(err).decode(errors="replace"))

    def _lost(self, argv: Sequence[str], account: str) -> TransportError:
        self._conns.pop(account, None)
        return TransportError(
            f"lost {self.host} while running `{shown(argv)}` as {account}; it may or may not "
            "have run"
        )

    async def _connection(self, account: str) -> asyncssh.SSHClientConnection:
        async with self._locks.setdefault(account, asyncio.Lock()):
            conn = self._conns.get(account)
            if conn is None or conn.is_closed():
                conn = self._conns[account] = await self._connect(account)
            return conn

    async def _connect(self, account: str) -> asyncssh.SSHClientConnection:
        check_name(account)
        if account == "root":
            raise NotPermitted(root_refusal(account, self.host))
        if not os.path.isfile(self._known_hosts):
            raise TransportError(
                f"known_hosts file {self._known_hosts} does not exist; put {self.host}'s host key "
                "there (ssh-keyscan, checked by hand) before Klique connects"
            )
        options = {
            "known_hosts": self._known_hosts,
            "client_keys": self._client_keys or (),
            "keepalive_interval": 15,  # notice a login node that went away while idle
        }
        try:
            async with asyncio.timeout(self._connect_timeout):
                conn = await asyncssh.connect(
                    *self._address, username=account, config=[], agent_path=None, **options
                )
        except TimeoutError:
            raise TransportError(
                f"connecting to {self.host} as {account} timed out after "
                f"{self._connect_timeout:g} s"
            ) from None
        except asyncssh.HostKeyNotVerifiable as exc:
            raise TransportError(
                f"refusing {self.host}: its host key is not trusted by {self._known_hosts} "
                f"({exc.reason}); add the right key there"
            ) from exc
        except asyncssh.PermissionDenied as exc:
            raise TransportError(
                f"{self.host} refused the login as '{account}' ({exc.reason}); check that the "
                "account exists there and that Klique's client key is authorized for it"
            ) from exc
        except (OSError, asyncssh.Error) as exc:
            raise TransportError(f"cannot reach {self.host} over SSH: {_reason(exc)}") from exc
        self.connections_opened += 1
        try:
            uid = await asyncio.wait_for(conn.run("id -u"), self._connect_timeout)
        except (TimeoutError, OSError, asyncssh.Error) as exc:
            conn.close()
            raise TransportError(f"`id -u` as {account} failed on {self.host}: {exc!r}") from exc
        if str(uid.stdout).strip() == "0":
            conn.close()
            raise NotPermitted(root_refusal(account, self.host))
        return conn


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncssh.Error):
        return exc.reason
    return str(exc) or type(exc).__name__
