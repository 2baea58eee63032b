"""The CLI's view of the API: one small HTTP client, errors turned into one-line reasons.

The credentials file keeps, per server, a Klique token, or a single sign-on entry (an access
token, its end, and the refresh token) that is renewed silently before it ends, or once when
the server refuses it; renewals by several processes at once take turns under a lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from broker import config
from broker.errors import KliqueError
from broker.identity import device

# An access token this close to its end is renewed before use, not after a refusal.
RENEW_BEFORE_S = 30.0


class ApiError(KliqueError):
    pass


def saved_token(api: str) -> str | None:
    if os.environ.get("KLIQUE_TOKEN"):
        return os.environ["KLIQUE_TOKEN"]
    token = config.saved_credentials().get(api)
    return token if isinstance(token, str) else None


def saved_sso(api: str) -> dict[str, Any] | None:
    """The single sign-on entry kept for `api`, if that is how this account logged in."""
    entry = config.saved_credentials().get(api)
    return entry if isinstance(entry, dict) and entry.get("kind") == "sso" else None


def save_token(api: str, token: str | dict[str, Any], profile: str | None = None) -> Path:
    """Keep the token (or single sign-on entry) for `api`, and `api` as `profile`'s server, in
    a file that is private from its first byte."""
    path = config.credentials_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tokens = config.saved_credentials()
    tokens[api] = token
    if profile is not None:
        profiles = tokens.get("profiles")
        tokens["profiles"] = {**(profiles if isinstance(profiles, dict) else {}), profile: api}
    config.write_private(path, json.dumps(tokens, indent=2))
    return path


@contextmanager
def _renewal_lock() -> Iterator[None]:
    path = config.credentials_path().with_name(".credentials.lock")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Client:
    def __init__(
        self,
        api: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        anonymous: bool = False,
        sso: dict[str, Any] | None = None,
    ):
        """`anonymous`: send no token (for the routes that log in); `sso`: a single sign-on
        entry of this client's own (a login's, not yet kept), renewed here and never shared."""
        self.api = (api or config.api_url()).rstrip("/")
        self.own_sso = sso is not None
        self.sso: dict[str, Any] | None = sso
        self.token: str | None = None
        if sso is None:
            self.token = None if anonymous else token or saved_token(self.api)
            self.sso = None if self.token or anonymous else saved_sso(self.api)
        if self.sso is not None:
            self.token = str(self.sso.get("access_token") or "")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(base_url=self.api + "/api/v1", headers=headers, timeout=timeout)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        if self.sso is not None and _due(self.sso):
            self._renew()
        response = self._send(method, path, **kwargs)
        if response.status_code == 401 and self.sso is not None:
            self._renew(refused=self.token)
            response = self._send(method, path, **kwargs)
        if not _from_klique(response):
            raise ApiError(not_klique(self.api, response))
        if response.status_code == 401:
            detail = _detail(response)
            then = "" if "klique login" in detail else "; then keep the new one with `klique login`"
            raise ApiError(f"the server at {self.api} refused the token: {detail}{then}")
        if response.status_code >= 400:
            raise ApiError(_detail(response))
        return response.json()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self.http.request(method, path, **kwargs)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise ApiError(
                f"{self.api} is not a server's URL ({exc}); set KLIQUE_API to one like "
                f"http://127.0.0.1:{config.DEFAULT_PORT}"
            ) from exc
        except httpx.TransportError as exc:
            raise ApiError(
                f"cannot reach the Klique server at {self.api} ({exc.__class__.__name__}); "
                "start one with `klique server`, or set KLIQUE_API"
            ) from exc

    def _renew(self, refused: str | None = None) -> None:
        """A fresh access token: one that another process renewed meanwhile, or a new one."""
        if self.own_sso:
            assert self.sso is not None
            self._use(device.renew(self.sso))
            return
        with _renewal_lock():
            entry = saved_sso(self.api) or self.sso
            assert entry is not None
            if _due(entry) or entry.get("access_token") in (refused, None):
                entry = device.renew(entry)
                save_token(self.api, entry)
        self._use(entry)

    def _use(self, entry: dict[str, Any]) -> None:
        self.sso = entry
        self.token = str(entry["access_token"])
        self.http.headers["Authorization"] = f"Bearer {self.token}"

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(
        self, path: str, body: Any = None, sending: Callable[[bytes], Any] | None = None
    ) -> Any:
        """POST `body` as JSON. `sending` turns the encoded body into what is sent, an iterable
        of its bytes in chunks (the CLI's bar counts them as they go); it is iterated again if
        the request is (a renewed single sign-on token)."""
        if sending is None:
            return self.call("POST", path, json=body)
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(data))}
        return self.call("POST", path, content=sending(data), headers=headers)

    def download(self, path: str, dest: Path, counter: Callable[[int], Any] | None = None) -> int:
        """Stream a download into dest: a new or regular file is written under a temporary name
        and renamed; anything else (a pipe, /dev/stdout) is written to, never replaced.
        `counter(total)` gives what counts the bytes as they come (`update(n)`, `close()`):
        the CLI's bar."""
        regular = not dest.exists() or dest.is_file()
        target = dest.with_name(f".{dest.name}.partial") if regular else dest
        size = 0
        try:
            with self.http.stream("GET", path) as response:
                if response.status_code >= 400:
                    response.read()
                    ok = _from_klique(response)
                    raise ApiError(_detail(response) if ok else not_klique(self.api, response))
                total = int(response.headers.get("content-length") or 0)
                counted = (counter or _Uncounted)(total)
                with contextlib.closing(counted), target.open("wb") as out:
                    for chunk in response.iter_bytes(1 << 20):
                        out.write(chunk)
                        size += len(chunk)
                        counted.update(len(chunk))
            if regular:
                target.replace(dest)
        except httpx.TransportError as exc:
            raise ApiError(f"the download from {self.api} broke off ({exc})") from exc
        finally:
            if regular:
                target.unlink(missing_ok=True)
        return size


class _Uncounted:
    """A download's bytes, counted by nobody."""

    def __init__(self, total: int) -> None:
        self.total = total

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _due(entry: dict[str, Any]) -> bool:
    return float(entry.get("expires_at") or 0) - RENEW_BEFORE_S <= time.time()


def _from_klique(response: httpx.Response) -> bool:
    """An answer of Klique's API: JSON, and for a refusal a `detail` that says why.

    Another program at the address (a web server, a proxy's error page), or a URL with a path
    that misses /api/v1 (the framework's bare "Not Found"), answers otherwise."""
    try:
        body = response.json()
    except ValueError:
        return False
    if response.status_code < 400:
        return True
    if not isinstance(body, dict) or "detail" not in body:
        return False
    return not (response.status_code == 404 and body["detail"] == "Not Found")


def not_klique(api: str, response: httpx.Response) -> str:
    kind = response.headers.get("content-type", "no content type").split(";")[0]
    return (
        f"the server at {api} did not answer as a Klique server (HTTP {response.status_code}, "
        f"{kind} from {response.request.url.path}); fix: set KLIQUE_API (or `klique login "
        f"--api`) to the address `klique server` prints, like http://127.0.0.1:{config.DEFAULT_PORT}"
    )


def _detail(response: httpx.Response) -> str:
    """The refusal's reason, as one line."""
    detail = response.json().get("detail")
    if isinstance(detail, list):  # FastAPI's validation errors
        return "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail
        )
    return one_line(str(detail))


def one_line(message: str) -> str:
    """A message as the one line it is printed as: the next prompt starts on a line of its own,
    and a message that spans lines (a server's words, several problems) is read as one."""
    said: list[str] = []
    for line in (" ".join(line.split()) for line in message.splitlines()):
        if line and said and said[-1].endswith(":"):
            said[-1] += f" {line}"
        elif line:
            said.append(line)
    return "; ".join(said) or "failed without a reason; see the log"
