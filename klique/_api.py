"""The SDK's view of the REST API: the standard library only (it runs inside jobs, on Python
3.8+). Which server and token: inside a Klique job, the task's own report URL and token from
its task.json; elsewhere $KLIQUE_API and $KLIQUE_TOKEN, else the CLI's credentials file."""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO, Dict, Optional

DEFAULT_API = "http://127.0.0.1:8765"
TIMEOUT_S = 60.0
CHUNK = 1 << 20


class KliqueError(Exception):
    """Something the SDK could not do; the message says what and how to fix it."""


def home() -> str:
    return os.path.expanduser(os.environ.get("KLIQUE_HOME") or "~/.klique")


def job_document() -> Optional[Dict[str, Any]]:
    """task.json of the Klique job this process runs in, or None outside any job."""
    job_dir = os.environ.get("KLIQUE_JOB_DIR")
    if not job_dir:
        return None
    try:
        with open(os.path.join(job_dir, "task.json"), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _credentials() -> Dict[str, Any]:
    try:
        with open(os.path.join(home(), "credentials.json"), encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _saved_token(api: str) -> Optional[str]:
    if os.environ.get("KLIQUE_TOKEN"):
        return os.environ["KLIQUE_TOKEN"]
    token = _credentials().get(api)
    return token if isinstance(token, str) else None


def _default_url() -> str:
    """As the CLI chooses (broker/config.py): $KLIQUE_PROFILE's server, else $KLIQUE_API, else
    the server of the last `klique login`, else the local server."""
    profiles = _credentials().get("profiles")
    profiles = profiles if isinstance(profiles, dict) else {}
    named = os.environ.get("KLIQUE_PROFILE")
    if named:
        if not isinstance(profiles.get(named), str):
            raise KliqueError(
                "profile %s has no server yet; fix: klique --profile %s login --api URL"
                % (named, named)
            )
        return str(profiles[named])
    saved = profiles.get("default")
    return os.environ.get("KLIQUE_API") or (saved if isinstance(saved, str) else DEFAULT_API)


class Api:
    """One server and one token; every call returns the decoded JSON or raises KliqueError."""

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None) -> None:
        self.url = (url or _default_url()).rstrip("/")
        self.token = token or _saved_token(self.url) or ""

    @classmethod
    def for_job(cls, doc: Dict[str, Any]) -> Api:
        report = doc.get("report")
        if not isinstance(report, dict) or not report.get("url"):
            raise KliqueError(
                "this job cannot reach the Klique API (its task.json has no report URL); "
                "ask the platform team to let the nodes reach the server"
            )
        return cls(str(report["url"]), str(report.get("token") or ""))

    @classmethod
    def here(cls) -> Api:
        """The API as seen from where this process runs: inside a Klique job, the URL and token
        of its job folder (the server's public URL; $KLIQUE_API on a compute node is some
        login shell's leftover, or the bind address); elsewhere $KLIQUE_API or the default."""
        doc = job_document()
        return cls.for_job(doc) if doc is not None else cls()

    def get(self, path: str, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v is not None}
        suffix = "?" + urllib.parse.urlencode(query) if query else ""
        return self.call("GET", path + suffix)

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path, body)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode("utf-8") if body is not None else None
        with self._open(method, path, data, {"Content-Type": "application/json"}) as response:
            return json.loads(response.read() or b"null")

    def upload(self, path: str, source: BinaryIO, size: int) -> Any:
        """PUT a file's content, streamed from `source` (never whole in memory)."""
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        with self._open("PUT", path, source, headers) as response:
            return json.loads(response.read())

    def download(self, path: str, dest: BinaryIO) -> None:
        with self._open("GET", path, None, {}) as response:
            shutil.copyfileobj(response, dest, CHUNK)

    def _open(self, method: str, path: str, data: Any, headers: Dict[str, str]) -> Any:
        request = urllib.request.Request(  # noqa: S310 (the API is http or https)
            self.url + "/api/v1" + path, data=data, method=method, headers=headers
        )
        if self.token:
            request.add_header("Authorization", "Bearer " + self.token)
        try:
            return urllib.request.urlopen(request, timeout=TIMEOUT_S)  # noqa: S310
        except urllib.error.HTTPError as exc:
            raise KliqueError(_detail(exc)) from None
        except (OSError, ValueError) as exc:
            fix = (
                "ask the platform team to set the server's public_url to an address the nodes reach"
                if job_document() is not None
                else "start one with `klique server`, or set KLIQUE_API"
            )
            raise KliqueError(
                f"cannot reach the Klique server at {self.url} ({exc}); {fix}"
            ) from None


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(exc.read()).get("detail")
    except (ValueError, AttributeError, OSError):
        return f"HTTP {exc.code}"
    if isinstance(detail, list):  # FastAPI's validation errors
        return "; ".join(
            ".".join(str(p) for p in d.get("loc", [])[1:]) + ": " + str(d.get("msg"))
            for d in detail
            if isinstance(d, dict)
        )
    return f"{detail} (HTTP {exc.code})"
