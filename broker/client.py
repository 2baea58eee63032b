"""The CLI's view of the API: one small HTTP client, errors turned into one-line reasons."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx

from broker import config
from broker.errors import KliqueError


class ApiError(KliqueError):
    pass


def credentials_path() -> Path:
    return config.home() / "credentials.json"


def saved_token(api: str) -> str | None:
    if os.environ.get("KLIQUE_TOKEN"):
        return os.environ["KLIQUE_TOKEN"]
    try:
        tokens = json.loads(credentials_path().read_text())
    except (OSError, ValueError):
        return None
    token = tokens.get(api) if isinstance(tokens, dict) else None
    return token if isinstance(token, str) else None


def save_token(api: str, token: str) -> Path:
    """Keep the token for `api` in a file that is private from its first byte."""
    path = credentials_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        tokens = json.loads(path.read_text())
    except (OSError, ValueError):
        tokens = {}
    tokens[api] = token
    config.write_private(path, json.dumps(tokens, indent=2))
    return path


class Client:
    def __init__(self, api: str | None = None, token: str | None = None, timeout: float = 30.0):
        self.api = (api or config.api_url()).rstrip("/")
        self.token = token or saved_token(self.api)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(base_url=self.api + "/api/v1", headers=headers, timeout=timeout)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiError(
                f"cannot reach the Klique server at {self.api} ({exc.__class__.__name__}); "
                "start one with `klique server`, or set KLIQUE_API"
            ) from exc
        if response.status_code == 401:
            raise ApiError(f"the server at {self.api} refused the token: {_detail(response)}")
        if response.status_code >= 400:
            raise ApiError(_detail(response))
        return response.json()

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path, json=body)

    def download(self, path: str, dest: Path) -> int:
        """Stream a download into dest: a new or regular file is written under a temporary name
        and renamed; anything else (a pipe, /dev/stdout) is written to, never replaced."""
        regular = not dest.exists() or dest.is_file()
        target = dest.with_name(f".{dest.name}.partial") if regular else dest
        size = 0
        try:
            with self.http.stream("GET", path) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ApiError(_detail(response))
                with target.open("wb") as out:
                    for chunk in response.iter_bytes(1 << 20):
                        out.write(chunk)
                        size += len(chunk)
            if regular:
                target.replace(dest)
        except httpx.TransportError as exc:
            raise ApiError(f"the download from {self.api} broke off ({exc})") from exc
        finally:
            if regular:
                target.unlink(missing_ok=True)
        return size


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:200]}"
    if isinstance(detail, list):  # FastAPI's validation errors
        return "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail
        )
    return str(detail)
