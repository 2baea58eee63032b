"""Single sign-on against a real OpenID Connect provider on loopback (scripts/oidc-up): the
CLI's device login, silent renewal, expiry, a user the provider drops, a group change moving a
user between teams, key rotation, and the browser's code flow with its session cookie."""

from __future__ import annotations

import asyncio
import json
import re
import stat
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from conftest import wait_for
from helpers.app import call, mcp_session
from helpers.identity import (
    TEAMS_ESTATE,
    browser_login,
    cli_env,
    klique,
    make_realm,
    page_csrf,
    sso_login,
)

from broker.cli import main
from broker.client import Client
from broker.identity import device


@pytest.fixture
def sso(server_factory, oidc_url, tmp_path):
    """make(token_lifetime) -> (server, realm, terminal env)."""

    def make(token_lifetime: int = 300):
        realm = make_realm(oidc_url, token_lifetime)
        server = server_factory(TEAMS_ESTATE + realm.estate())
        realm.client("klique", [f"{server.url}/auth/callback"])
        return server, realm, cli_env(server.url, tmp_path / "terminal")

    return make


def whoami(server, token: str) -> httpx.Response:
    return httpx.get(f"{server.url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})


def credentials(env: dict[str, str]) -> dict:
    path = Path(env["KLIQUE_HOME"]) / "credentials.json"
    return json.loads(path.read_text())[env["KLIQUE_API"]]


def test_a_person_logs_in_with_the_device_flow_and_submits_as_themselves(sso) -> None:
    server, realm, env = sso()
    password = realm.user("alice", ["cv-lab"])
    done = sso_login(env, realm, "alice", password)
    assert done.returncode == 0, done.stderr
    assert "To log in, open https://127.0.0.1" in done.stderr
    assert "logged in to" in done.stdout and "as alice, team vision" in done.stdout
    path = Path(env["KLIQUE_HOME"]) / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    kept = credentials(env)
    assert kept["kind"] == "sso" and kept["refresh_token"] and kept["access_token"]
    submitted = klique(env, "submit", "--no-code", "--json", "--", "true")
    assert submitted.returncode == 0, submitted.stderr
    task = json.loads(submitted.stdout)
    assert (task["owner"], task["team"]) == ("alice", "vision")


def test_a_login_whose_token_ends_before_the_check_keeps_a_renewed_one(sso, monkeypatch) -> None:
    """A slow machine: the access token ends between the provider's answer and the server's
    check of it. The login renews it with the refresh token instead of failing."""
    server, realm, env = sso(token_lifetime=2)
    password = realm.user("alice", ["cv-lab"])
    provider_login = device.device_login
    ended_tokens = []

    def slow_login(oidc, show, **kwargs):
        def confirm(line: str) -> None:
            show(line)
            code = re.search(r"confirm the code (\S+)", line)
            assert code, line
            realm.approve(code[1], "alice", password).raise_for_status()

        entry = provider_login(oidc, confirm, **kwargs)
        ended = lambda: whoami(server, entry["access_token"]).status_code == 401  # noqa: E731
        wait_for(ended, 30, "the new access token to end")
        ended_tokens.append(entry["access_token"])
        return entry

    monkeypatch.setattr(device, "device_login", slow_login)
    for key in ("KLIQUE_API", "KLIQUE_HOME", "SSL_CERT_FILE"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("KLIQUE_TOKEN", raising=False)
    done = CliRunner().invoke(main, ["login", "--sso"])
    assert done.exit_code == 0, done.output
    assert "as alice, team vision" in done.output
    assert credentials(env)["access_token"] not in ended_tokens
    assert klique(env, "ls").returncode == 0


def test_expired_access_tokens_are_refused_and_renewed_silently(sso) -> None:
    server, realm, env = sso(token_lifetime=2)
    password = realm.user("alice", ["cv-lab"])
    assert sso_login(env, realm, "alice", password).returncode == 0
    first = credentials(env)

    def refused() -> httpx.Response | None:
        answer = whoami(server, first["access_token"])
        return answer if answer.status_code == 401 else None

    answer = wait_for(refused, 30, "the first access token to expire")
    assert "it has expired" in answer.json()["detail"]
    listed = klique(env, "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    renewed = credentials(env)
    assert renewed["access_token"] != first["access_token"]
    assert renewed["refresh_token"] != first["refresh_token"]  # the provider rotates them


def test_a_user_the_provider_drops_is_refused_at_the_next_renewal(sso) -> None:
    server, realm, env = sso(token_lifetime=2)
    password = realm.user("alice", ["cv-lab"])
    assert sso_login(env, realm, "alice", password).returncode == 0
    realm.drop("alice")

    def refused() -> str:
        done = klique(env, "ls")
        return done.stderr if done.returncode != 0 else ""

    message = wait_for(refused, 30, "the dropped user to be refused")
    assert "single sign-on session has ended" in message
    assert "klique login --sso" in message


def test_a_group_change_moves_the_user_to_another_team(sso, monkeypatch) -> None:
    server, realm, env = sso(token_lifetime=2)
    password = realm.user("bob", ["cv-lab"])
    assert sso_login(env, realm, "bob", password).returncode == 0
    for key in ("KLIQUE_API", "KLIQUE_HOME", "SSL_CERT_FILE"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("KLIQUE_TOKEN", raising=False)
    sdk = Client()  # the SDK's client: the same credentials as the CLI
    assert sdk.get("/whoami")["team"] == "vision"
    realm.groups("bob", ["nlp-lab"])
    wait_for(lambda: Client().get("/whoami")["team"] == "language", 30, "bob's new team")
    task = Client().post("/tasks", {"command": ["true"]})
    assert (task["owner"], task["team"]) == ("bob", "language")
    server.wait_state(task["id"])
    with server.api() as api:
        usage = api.get("/usage", params={"by": "team"}).json()
    assert {row["key"] for row in usage["rows"]} == {"language"}


def test_a_person_in_no_mapped_group_is_refused_with_the_reason(sso) -> None:
    server, realm, env = sso()
    password = realm.user("alice", ["marketing"])
    tokens = realm.device_tokens("alice", password)
    answer = whoami(server, tokens["access_token"])
    assert answer.status_code == 403
    assert "in none of the groups that make a team" in answer.json()["detail"]


def test_a_token_from_another_issuer_is_refused(sso, oidc_url) -> None:
    server, realm, env = sso()
    other = make_realm(oidc_url)
    password = other.user("alice", ["cv-lab"])
    tokens = other.device_tokens("alice", password)
    answer = whoami(server, tokens["access_token"])
    assert answer.status_code == 401
    assert "the provider does not publish" in answer.json()["detail"]


def test_rotated_keys_are_fetched_and_retired_ones_refused(sso) -> None:
    server, realm, env = sso()
    password = realm.user("alice", ["cv-lab"])
    old = realm.device_tokens("alice", password)["access_token"]

    assert whoami(server, old).status_code == 200
    realm.rotate()  # a new signing key; the old one is still published
    new = realm.device_tokens("alice", password)["access_token"]
    assert whoami(server, new).status_code == 200  # an unknown key id: the server fetched the keys
    assert whoami(server, old).status_code == 200
    realm.rotate(retire=True)
    newest = realm.device_tokens("alice", password)["access_token"]
    assert whoami(server, newest).status_code == 200
    refused = whoami(server, old)
    assert refused.status_code == 401 and "does not publish" in refused.json()["detail"]


def test_the_browser_logs_in_with_a_session_cookie_and_a_csrf_header(sso) -> None:
    server, realm, env = sso()
    password = realm.user("alice", ["cv-lab"])
    browser = browser_login(server.url, "alice", password)
    cookies = {c.name: c for c in browser.cookies.jar}
    assert cookies["klique_session"].has_nonstandard_attr("HttpOnly")
    assert "klique_csrf" not in cookies  # the CSRF token is in the UI's pages, no cookie
    me = browser.get(f"{server.url}/api/v1/whoami").json()
    assert (me["user"], me["team"], me["via"]) == ("alice", "vision", "session")
    body = {"command": ["true"]}
    refused = browser.post(f"{server.url}/api/v1/tasks", json=body)
    assert refused.status_code == 403 and "X-Klique-CSRF" in refused.json()["detail"]
    csrf = page_csrf(browser, server.url)
    made = browser.post(f"{server.url}/api/v1/tasks", json=body, headers={"X-Klique-CSRF": csrf})
    assert made.status_code == 201 and made.json()["owner"] == "alice"
    out = browser.post(f"{server.url}/auth/logout", headers={"X-Klique-CSRF": csrf})
    assert out.status_code == 200 and out.json()["end_session_endpoint"].startswith(realm.issuer)
    assert browser.get(f"{server.url}/api/v1/whoami").status_code == 401


def test_a_browser_session_ends_when_the_provider_drops_the_user(sso) -> None:
    server, realm, env = sso(token_lifetime=2)
    password = realm.user("alice", ["cv-lab"])
    browser = browser_login(server.url, "alice", password)
    assert browser.get(f"{server.url}/api/v1/whoami").status_code == 200
    realm.drop("alice")

    def ended() -> httpx.Response | None:
        answer = browser.get(f"{server.url}/api/v1/whoami")
        return answer if answer.status_code == 401 else None

    answer = wait_for(ended, 30, "the session to end")
    assert "single sign-on session has ended" in answer.json()["detail"]


def test_routes_and_mcp_take_the_same_tokens_as_the_api(sso) -> None:
    """A single sign-on access token is its person on MCP and on routes too; a read-only
    Klique token may look through MCP but its submit is refused, naming the scope."""
    server, realm, _ = sso()
    password = realm.user("alice", ["cv-lab"])
    access = realm.device_tokens("alice", password)["access_token"]
    with server.api() as api:
        reader = api.post("/tokens", json={"user": "bob", "scopes": ["read"]}).json()["token"]
    route = "/routes/none-here/"
    refused = httpx.get(f"{server.routes_url}{route}", headers={"Authorization": "Bearer x.y.z"})
    assert refused.status_code == 401
    known = httpx.get(f"{server.routes_url}{route}", headers={"Authorization": f"Bearer {access}"})
    assert known.status_code == 404 and "no route none-here" in known.text

    async def scenario() -> None:
        async with mcp_session(server, access) as session:
            failed, text = await call(session, "submit_task", command=["true"], resource="cpu")
            assert not failed, text
            failed, text = await call(session, "show_task", task_id=json.loads(text)["id"])
            assert (json.loads(text)["owner"], json.loads(text)["team"]) == ("alice", "vision")
        async with mcp_session(server, reader) as session:
            failed, text = await call(session, "list_runs")
            assert not failed and json.loads(text) == []
            failed, text = await call(session, "submit_task", command=["true"], resource="cpu")
            assert failed and "needs the 'submit' scope" in text

    asyncio.run(scenario())
