"""The web UI as a browser reaches it without one: an HTTP client signed in with a token
through the login form (its login token read from the page, as a browser sends it back)."""

from __future__ import annotations

import re

import httpx
from conftest import Server


def signed_in(server: Server, token: str) -> httpx.Client:
    """A browser-like client signed in to `server`'s web UI with `token`; redirects are not
    followed, so a test sees the answer a page gave."""
    client = httpx.Client(base_url=server.url, timeout=30, follow_redirects=False)
    form = client.get("/login").text
    login_token = re.search(r'name="login_token" value="([^"]+)"', form)[1]  # type: ignore[index]
    answer = client.post("/login", data={"token": token, "login_token": login_token})
    assert answer.status_code == 303, answer.text
    return client
