"""Attacks on who a caller is: forged, foreign, expired and retired single sign-on tokens;
scoped, expired and revoked Klique tokens; browser sessions without their CSRF header, fixed in
advance, or opened by another browser's login; the same-name user map as root or a denied
account; LDAP names that try to change the query. Real servers, a real provider, real slapd."""

from __future__ import annotations

import base64
import json
import os
import re

import httpx
import pytest
from conftest import wait_for
from helpers.identity import (
    TEAMS_ESTATE,
    TLS,
    Directory,
    browser_login,
    ldap_estate,
    make_realm,
    page_csrf,
)
from joserfc import jwt
from joserfc.jwk import OctKey, RSAKey

from .conftest import RESOURCE, as_account

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acting as alice and bob needs root")


@pytest.fixture
def sso_server(server_factory, oidc_url):
    realm = make_realm(oidc_url)
    server = server_factory(TEAMS_ESTATE + realm.estate())
    realm.client("klique", [f"{server.url}/auth/callback"])
    realm.client("other-app", [])
    return server, realm


def whoami(server, token: str) -> httpx.Response:
    return httpx.get(f"{server.url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})


def _b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def test_forged_and_foreign_tokens_are_refused(sso_server, oidc_url) -> None:
    server, realm = sso_server
    password = realm.user("alice", ["cv-lab", "klique-admins"])
    good = realm.device_tokens("alice", password)["access_token"]
    assert whoami(server, good).json()["admin"] is True
    header = json.loads(base64.urlsafe_b64decode(good.split(".")[0] + "=="))
    claims = json.loads(base64.urlsafe_b64decode(good.split(".")[1] + "=="))
    jwks = httpx.get(f"{realm.issuer}/jwks", verify=TLS).json()
    public = RSAKey.import_key(jwks["keys"][0])
    forger = RSAKey.generate_key(2048, parameters={"kid": header["kid"]})
    other = make_realm(oidc_url)
    other.user("alice", ["cv-lab", "klique-admins"], password)
    attempts = {
        "re-signed with the forger's key under the real key id": (
            jwt.encode({"alg": "RS256", "kid": header["kid"]}, claims, forger),
            "signature does not verify",
        ),
        "alg none": (f"{_b64({'alg': 'none', 'kid': header['kid']})}.{_b64(claims)}.", "'none'"),
        "HS256 keyed with the public key": (
            jwt.encode(
                {"alg": "HS256", "kid": header["kid"]},
                claims,
                OctKey.import_key(json.dumps(public.as_dict()).encode()),
            ),
            "'HS256'",
        ),
        "the claims changed, the signature kept": (
            ".".join([good.split(".")[0], _b64({**claims, "groups": ["klique-admins"]}), "x"]),
            "signature does not verify",
        ),
        "another issuer's token": (
            other.device_tokens("alice", password)["access_token"],
            "does not publish",
        ),
        "a token for another application of the same provider": (
            realm.device_tokens("alice", password, client_id="other-app")["access_token"],
            "meant for 'other-app'",
        ),
    }
    for what, (token, reason) in attempts.items():
        answer = whoami(server, token)
        assert answer.status_code == 401, what
        assert reason in answer.json()["detail"], (what, answer.text)


def test_an_expired_provider_token_is_refused(server_factory, oidc_url) -> None:
    realm = make_realm(oidc_url, token_lifetime=1)
    server = server_factory(TEAMS_ESTATE + realm.estate())
    token = realm.device_tokens("alice", realm.user("alice", ["cv-lab"]))["access_token"]
    expired = wait_for(lambda: whoami(server, token).status_code == 401, 30, "the token's end")
    assert expired and "expired" in whoami(server, token).json()["detail"]


def test_scoped_expired_and_revoked_klique_tokens(host_server) -> None:
    server = host_server
    with server.api() as admin:
        made = admin.post("/tokens", json={"user": "alice", "scopes": ["read"]}).json()
        short = admin.post("/tokens", json={"user": "alice", "expires_in": 1}).json()
        submit_only = admin.post("/tokens", json={"user": "bob", "scopes": ["submit"]}).json()
    with server.api(made["token"]) as reader:
        assert reader.get("/tasks").status_code == 200
        refused = reader.post("/tasks", json={"command": ["true"]})
        assert refused.status_code == 403 and "'submit' scope" in refused.json()["detail"]
        escalate = reader.post("/tokens", json={"user": "alice"})
        assert escalate.status_code == 403
    with server.api(submit_only["token"]) as submitter:
        assert submitter.post("/tasks", json={"command": ["true"]}).status_code == 201
        assert submitter.get("/tasks").status_code == 403
        made_admin = submitter.post("/tokens", json={"user": "bob", "admin": True})
        assert made_admin.status_code == 403 and "only an admin" in made_admin.json()["detail"]
    wait_for(lambda: whoami(server, short["token"]).status_code == 401, 30, "the expiry")
    assert "has expired" in whoami(server, short["token"]).json()["detail"]
    with server.api(made["token"]) as reader:
        foreign = reader.post(f"/tokens/{submit_only['id']}/revoke")
        assert foreign.status_code == 403  # read-only: it cannot even try
    with server.api() as admin:
        assert admin.post(f"/tokens/{made['id']}/revoke").json()["revoked"] is True
    revoked = whoami(server, made["token"])
    assert revoked.status_code == 401 and "was revoked" in revoked.json()["detail"]


def test_a_user_cannot_revoke_or_see_another_users_tokens(host_server) -> None:
    server = host_server
    alice, bob = server.make_token("alice"), server.make_token("bob")
    with server.api(bob) as api:
        listed = api.get("/tokens").json()
        assert {t["user"] for t in listed} == {"bob"}
    with server.api() as admin:
        alice_id = next(t["id"] for t in admin.get("/tokens").json() if t["user"] == "alice")
    with server.api(bob) as api:
        assert api.post(f"/tokens/{alice_id}/revoke").status_code == 404
    assert whoami(server, alice).status_code == 200


def test_a_cookie_without_its_csrf_header_changes_nothing(sso_server) -> None:
    server, realm = sso_server
    browser = browser_login(server.url, "alice", realm.user("alice", ["cv-lab"]))
    csrf = page_csrf(browser, server.url)
    for headers in ({}, {"X-Klique-CSRF": "guess"}, {"X-Klique-CSRF": ""}):
        answer = browser.post(
            f"{server.url}/api/v1/tasks", json={"command": ["true"]}, headers=headers
        )
        assert answer.status_code == 403, headers
    assert browser.get(f"{server.url}/api/v1/tasks").json() == []
    logout = browser.post(f"{server.url}/auth/logout")
    assert logout.status_code == 403  # a page elsewhere cannot log the user out either
    assert (
        browser.post(f"{server.url}/auth/logout", headers={"X-Klique-CSRF": csrf}).status_code
        == 200
    )


def test_a_session_id_fixed_in_advance_is_never_used(sso_server) -> None:
    server, realm = sso_server
    browser = httpx.Client(verify=TLS, timeout=30)
    planted = "attacker-chose-this-session-id"
    browser.cookies.set("klique_session", planted, domain="127.0.0.1")
    assert browser.get(f"{server.url}/api/v1/whoami").status_code == 401
    browser_login(server.url, "alice", realm.user("alice", ["cv-lab"]), browser=browser)
    session = [c for c in browser.cookies.jar if c.name == "klique_session"]
    assert [c.value for c in session] != [planted] and all(c.value != planted for c in session)
    attacker = httpx.Client(cookies={"klique_session": planted})
    assert attacker.get(f"{server.url}/api/v1/whoami").status_code == 401


def test_a_login_finished_in_another_browser_is_refused(sso_server) -> None:
    """Login CSRF: the attacker's own callback URL, opened in the victim's browser."""
    server, realm = sso_server
    password = realm.user("mallory", ["cv-lab"])
    attacker = httpx.Client(verify=TLS, timeout=30)
    start = attacker.get(f"{server.url}/auth/login")
    form = attacker.post(
        start.headers["location"], data={"username": "mallory", "password": password}
    )
    callback = form.headers["location"]
    victim = httpx.Client(timeout=30)
    answer = victim.get(callback)
    assert answer.status_code == 400 and "not started in this browser" in answer.json()["detail"]
    assert "klique_session" not in victim.cookies


def test_a_login_leads_back_only_to_this_server(sso_server) -> None:
    server, realm = sso_server
    for target in ("//evil.example.com/x", "https://evil.example.com", "/\\evil.example.com"):
        answer = httpx.get(f"{server.url}/auth/login", params={"next": target})
        assert answer.status_code == 422, target


def test_the_same_name_rule_runs_each_user_as_their_own_account(server_factory) -> None:
    server = server_factory(
        RESOURCE
        + "pools:\n  p:\n    kind: host\n    slots: 2\n    job_root: $JOB_ROOT\n"
        + "    query_account: alice\n    user_map: {rule: same-name, deny: [bob]}\n"
    )
    tokens = {name: server.make_token(name) for name in ("alice", "bob", "root")}
    ids = {}
    for name, token in tokens.items():
        with server.api(token) as api:
            ids[name] = api.post("/tasks", json={"command": ["id", "-un"]}).json()["id"]
    done = server.wait_state(ids["alice"], token=tokens["alice"])
    assert done["state"] == "completed"
    with server.api(tokens["alice"]) as api:
        assert api.get(f"/tasks/{ids['alice']}/logs").json()["text"].strip() == "alice"
    for name in ("bob", "root"):
        task = server.wait_state(ids[name], {"failed"}, token=tokens[name])
        assert "user_map" in task["reason"], task
    assert as_account("alice", "true").returncode == 0


def test_ldap_names_cannot_change_the_query(server_factory, ldap_url) -> None:
    server = server_factory(TEAMS_ESTATE + ldap_estate(ldap_url))
    Directory(ldap_url).person(["cv-lab"])
    with server.api() as api:
        for name in ("*", "a)(uid=*", "admin,dc=klique", "x\x00y"):
            answer = api.post("/auth/ldap", json={"user": name, "password": "x"})
            assert answer.status_code == 422, name


def _ldap_login(server, user: str, password: str) -> httpx.Response:
    with server.api() as api:
        return api.post("/auth/ldap", json={"user": user, "password": password})


def _full_width(text: str) -> str:
    """The same letters and digits as full-width forms (U+FF01..U+FF5E)."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def test_another_spelling_of_an_ldap_name_is_the_same_user(server_factory, ldap_url) -> None:
    """The directory matches uid ignoring case and surrounding spaces: the right password
    under another spelling is the same person, never a second Klique user."""
    server = server_factory(TEAMS_ESTATE + ldap_estate(ldap_url))
    user, password = Directory(ldap_url).person(["cv-lab"])
    spellings = [user.upper(), user.capitalize(), f" {user}", f"{user} ", _full_width(user)]
    for spelling in spellings:
        answer = _ldap_login(server, spelling, password)
        assert answer.status_code == 201, (spelling, answer.text)
        assert answer.json()["user"] == user, spelling
        assert whoami(server, answer.json()["token"]).json()["user"] == user
    with server.api() as admin:
        people = {t["user"] for t in admin.get("/tokens").json() if t["kind"] == "user"}
    assert people == {user}


def test_failed_ldap_tries_under_every_spelling_count_together(server_factory, ldap_url) -> None:
    server = server_factory(TEAMS_ESTATE + ldap_estate(ldap_url))
    user, password = Directory(ldap_url).person(["cv-lab"])
    spellings = [user, user.upper(), f" {user}", f"{user} ", _full_width(user)]
    codes = [_ldap_login(server, spelling, "guess").status_code for spelling in spellings]
    assert codes == [401] * 5
    for spelling in (user, user.capitalize(), f"  {user}"):
        refused = _ldap_login(server, spelling, password)  # even the right password, for now
        assert refused.status_code == 429, (spelling, refused.text)
        assert refused.json()["detail"] == "too many failed logins for this user; wait a minute"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60


def test_one_address_trying_many_names_is_throttled(server_factory, ldap_url) -> None:
    """One password sprayed over many names: each name fails once, the address many times."""
    server = server_factory(TEAMS_ESTATE + ldap_estate(ldap_url))
    user, password = Directory(ldap_url).person(["cv-lab"])
    codes = [_ldap_login(server, f"nobody-{n}", password).status_code for n in range(20)]
    assert codes == [401] * 20
    refused = _ldap_login(server, user, password)
    assert refused.status_code == 429, refused.text
    assert refused.json()["detail"] == "too many failed logins from this address; wait a minute"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    # A forwarding header is no way out: the server believes no proxy unless told to.
    with server.api() as api:
        forged = api.post(
            "/auth/ldap",
            json={"user": user, "password": password},
            headers={"X-Forwarded-For": "192.0.2.7"},
        )
    assert forged.status_code == 429, forged.text
    # Another address (127.0.0.0/8 is all loopback) is not slowed by this one's failures.
    with from_address("127.0.0.7", server.url) as elsewhere:
        answer = elsewhere.post("/api/v1/auth/ldap", json={"user": user, "password": password})
    assert answer.status_code == 201, answer.text


def from_address(address: str, base_url: str) -> httpx.Client:
    """A client whose connections come from `address`, as a caller on another host would."""
    return httpx.Client(
        base_url=base_url, transport=httpx.HTTPTransport(local_address=address), timeout=30
    )


def test_the_sign_in_forms_failures_count_against_the_browsers_address(
    server_factory, ldap_url
) -> None:
    """The web UI's form asks the API's LDAP login in-process: the failures it makes are the
    browser's address's, not the server's own (which would slow every browser at once)."""
    server = server_factory(TEAMS_ESTATE + ldap_estate(ldap_url))
    user, password = Directory(ldap_url).person(["cv-lab"])
    browser = from_address("127.0.0.9", server.url)
    found = re.search(r'name="login_token" value="([^"]+)"', browser.get("/login").text)
    assert found, "the sign-in page's form token"

    def sign_in(name: str, secret: str) -> httpx.Response:
        form = {"login_token": found[1], "ldap_user": name, "password": secret, "next": "/"}
        return browser.post("/login", data=form)

    codes = [sign_in(f"nobody-{n}", "guess").status_code for n in range(20)]
    assert codes == [401] * 20
    refused = sign_in(user, password)
    assert refused.status_code == 401 and "too many failed logins from this address" in refused.text
    assert _ldap_login(server, user, password).status_code == 201  # another address: not slowed


def test_another_spelling_of_a_provider_name_is_the_same_user(sso_server) -> None:
    server, realm = sso_server
    password = realm.user("Carol.Smith", ["cv-lab"])
    token = realm.device_tokens("Carol.Smith", password)["access_token"]
    assert whoami(server, token).json()["user"] == "carol.smith"
    realm.user("Not A Name", ["cv-lab"], password)
    token = realm.device_tokens("Not A Name", password)["access_token"]
    refused = whoami(server, token)
    assert refused.status_code == 403
    assert "'Not A Name' is not a Klique user name" in refused.json()["detail"]
