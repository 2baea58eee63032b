"""Attacks on the web UI, against a live server whose tasks run as alice and bob: forged
state-changing requests (CSRF), the session cookie's flags and storage, session fixation,
another user's task by URL, markup in task names, consoles and scalar names, and framing."""

from __future__ import annotations

import re
import sqlite3
import time
from types import SimpleNamespace

import httpx
import pytest
from conftest import FINAL, TASK_PY, wait_for

from broker.web.site import web_router

from .conftest import SERVER_SECRET, Attack, host_estate, submit

XSS = "<script>alert(1)</script><img src=x onerror=alert(2)>"


def signed_in(attack: Attack, token: str) -> tuple[httpx.Client, str]:
    """A browser-like client signed in with `token`, and its CSRF token."""
    client = httpx.Client(base_url=attack.server.url, timeout=30, follow_redirects=False)
    form = client.get("/login").text
    login_token = re.search(r'name="login_token" value="([^"]+)"', form)[1]  # type: ignore[index]
    answer = client.post("/login", data={"token": token, "login_token": login_token})
    assert answer.status_code == 303, answer.text
    page = client.get("/tasks").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)[1]  # type: ignore[index]
    return client, csrf


def sse_text(client: httpx.Client, path: str, seconds: float = 3.0) -> str:
    """What a live stream sends within `seconds` (streams stay open: read a while, then stop)."""
    lines: list[str] = []
    deadline = time.monotonic() + seconds
    try:
        with client.stream("GET", path, timeout=httpx.Timeout(30, read=seconds)) as answer:
            for line in answer.iter_lines():
                lines.append(line)
                if time.monotonic() > deadline:
                    break
    except httpx.ReadTimeout:
        pass  # nothing more within the time: what came is the answer
    return "\n".join(lines)


def post_routes() -> list[str]:
    """Every state-changing route of the UI, read from its router (a new one is covered)."""
    router = web_router(SimpleNamespace(store=None))  # type: ignore[arg-type]
    return sorted(
        route.path  # type: ignore[attr-defined]
        for route in router.routes
        if "POST" in getattr(route, "methods", ())
    )


@pytest.fixture(scope="module")
def host(module_server_factory) -> Attack:
    """One server for this module's attacks (each start costs seconds): each test makes its
    own tasks, looks only at them, and cancels those that would run on."""
    server = module_server_factory(host_estate(), AWS_SECRET_ACCESS_KEY=SERVER_SECRET)
    assert server.job_root is not None
    alice, bob = server.make_token("alice"), server.make_token("bob")
    return Attack(server, "host", server.job_root, alice, bob)


def test_every_state_changing_route_refuses_a_forged_request(host) -> None:
    with host.server.api(host.alice) as api:
        before = [t["id"] for t in api.get("/tasks").json()]
    victim = submit(host, host.alice, "sleep 600", resource="cpu", name="victim")
    client, csrf = signed_in(host, host.alice)
    routes = post_routes()
    assert {"/login", "/logout", "/tasks/cancel", "/tasks/{task_id}/cancel"} <= set(routes)
    for path in routes:
        url = path.format(task_id=victim, name="x", app_id="1", version="1")
        altered = csrf[:-1] + ("A" if csrf[-1] != "A" else "B")
        for forged in ({}, {"csrf": "0" * 64}, {"csrf": altered}):
            fields = {**forged, "id": str(victim), "token": host.alice, "next": "/"}
            answer = client.post(url, data=fields)
            assert answer.status_code == 403, (url, forged, answer.status_code, answer.text)
        assert client.get("/tasks").status_code == 200  # still signed in: logout was refused
    # The API, reached with the cookie alone, wants the token in the X-Klique-CSRF header.
    for path, body in (
        (f"/api/v1/tasks/{victim}/cancel", None),
        ("/api/v1/tasks", {"command": ["id"]}),
    ):
        assert client.post(path, json=body).status_code == 403
        assert client.post(path, json=body, headers={"X-Klique-CSRF": "f" * 64}).status_code == 403
    with host.server.api(host.alice) as api:
        assert api.get(f"/tasks/{victim}").json()["state"] not in FINAL
        assert [t["id"] for t in api.get("/tasks").json()] == [victim, *before]
    # With its token, the same request works: the refusals above were the CSRF check.
    done = client.post(f"/tasks/{victim}/cancel", data={"csrf": csrf})
    assert done.status_code == 303
    host.server.wait_state(victim, {"cancelled"}, token=host.alice)


def test_the_session_cookie_is_httponly_samesite_and_stored_as_a_digest(host) -> None:
    client = httpx.Client(base_url=host.server.url, timeout=30)
    form = client.get("/login")
    login_cookie = form.headers["set-cookie"]
    assert "HttpOnly" in login_cookie and "SameSite=strict" in login_cookie
    login_token = re.search(r'name="login_token" value="([^"]+)"', form.text)[1]  # type: ignore[index]
    answer = client.post("/login", data={"token": host.alice, "login_token": login_token})
    cookie = [c for c in answer.headers.get_list("set-cookie") if c.startswith("klique_session=")]
    assert cookie and "HttpOnly" in cookie[0] and "SameSite=lax" in cookie[0]
    assert "Path=/" in cookie[0]
    session_id = client.cookies["klique_session"]
    assert len(session_id) >= 43  # 256 random bits
    database = (host.server.home / "klique.db").read_bytes()
    for wal in host.server.home.glob("klique.db-wal"):
        database += wal.read_bytes()
    assert session_id.encode() not in database
    rows = sqlite3.connect(host.server.home / "klique.db").execute(
        "SELECT digest, user FROM sessions"
    )
    import hashlib

    assert (hashlib.sha256(session_id.encode()).hexdigest(), "alice") in list(rows)


def test_a_session_id_chosen_before_sign_in_is_never_used(host) -> None:
    planted = "attacker-chosen-session-id-0123456789abcdef0123"
    client = httpx.Client(base_url=host.server.url, timeout=30, cookies={"klique_session": planted})
    form = client.get("/login")
    login_token = re.search(r'name="login_token" value="([^"]+)"', form.text)[1]  # type: ignore[index]
    answer = client.post("/login", data={"token": host.alice, "login_token": login_token})
    assert answer.status_code == 303
    fresh = answer.cookies["klique_session"]
    assert fresh != planted
    attacker = httpx.Client(
        base_url=host.server.url, timeout=30, cookies={"klique_session": planted}
    )
    assert attacker.get("/tasks", headers={"Accept": "text/html"}).status_code == 303  # to sign in
    assert attacker.get("/api/v1/whoami").status_code == 401
    # Signing out ends the session on the server: the old cookie, replayed, opens nothing.
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/tasks").text)[1]  # type: ignore[index]
    assert client.post("/logout", data={"csrf": csrf}).status_code == 303
    replay = httpx.Client(base_url=host.server.url, timeout=30, cookies={"klique_session": fresh})
    assert replay.get("/api/v1/whoami").status_code == 401


def test_a_token_session_is_its_token_revoked_or_read_only(host) -> None:
    victim = submit(host, host.alice, "sleep 600", resource="cpu", name="victim")
    with host.server.api(host.server.token) as admin:
        made = admin.post("/tokens", json={"user": "alice", "scopes": ["read"]}).json()
    looker, csrf = signed_in(host, made["token"])
    assert "victim" in looker.get("/tasks").text  # a read-only session may look
    refused = looker.post(f"/tasks/{victim}/cancel", data={"csrf": csrf})
    assert refused.status_code == 403 and "may only read" in refused.text
    api = looker.post(f"/api/v1/tasks/{victim}/cancel", headers={"X-Klique-CSRF": csrf})
    assert api.status_code == 403
    with host.server.api(host.alice) as alice:
        assert alice.get(f"/tasks/{victim}").json()["state"] not in FINAL
        alice.post(f"/tokens/{made['id']}/revoke")
        # Revoking the token ends the session it signed in: pages send the browser to sign in.
        assert looker.get("/tasks", headers={"Accept": "text/html"}).status_code == 303
        assert looker.get("/api/v1/whoami").status_code == 401
        alice.post(f"/tasks/{victim}/cancel")


def test_another_users_task_is_out_of_reach_by_url(host) -> None:
    secret = "alices-secret-experiment"
    victim = submit(host, host.alice, "echo alices-console; sleep 600", resource="cpu", name=secret)
    bob, csrf = signed_in(host, host.bob)
    for path in (f"/tasks/{victim}", f"/compare?ids={victim}", f"/tasks/{victim}/clone", "/tasks"):
        page = bob.get(path)
        assert secret not in page.text and "alices-console" not in page.text, path
    assert bob.get(f"/tasks/{victim}").status_code == 404
    assert bob.get(f"/tasks?q={secret[:10]}&owner=alice").text.count(f'id="task-{victim}"') == 0
    stream = sse_text(bob, f"/events/tasks/{victim}")
    assert secret not in stream and "alice" not in stream and "event: done" in stream
    listing = sse_text(bob, f"/events/tasks?ids={victim}&page=first&top=0&since=0")
    assert secret not in listing and f"task-{victim}" not in listing
    assert bob.post(f"/tasks/{victim}/cancel", data={"csrf": csrf}).status_code == 404
    assert bob.post("/tasks/cancel", data={"csrf": csrf, "id": str(victim)}).status_code == 404
    assert bob.get(f"/api/v1/tasks/{victim}/logs").status_code == 404
    with host.server.api(host.alice) as api:
        assert api.get(f"/tasks/{victim}").json()["state"] not in FINAL
        api.post(f"/tasks/{victim}/cancel")


def test_markup_in_names_consoles_and_scalar_names_is_shown_as_text(host) -> None:
    code = (
        "from inside_job import report\n"
        f"print({XSS!r}, flush=True)\n"
        f"report.scalar({XSS!r}, 1.0, step=1)\n"
        "report.scalar('</script><script>alert(3)</script>', 2.0, step=1)\n"
    )
    task_id = submit(host, host.alice, f'{TASK_PY} -c "$CODE"', name=XSS, env={"CODE": code})
    assert host.server.wait_state(task_id, token=host.alice)["state"] == "completed"
    client, _ = signed_in(host, host.alice)
    wait_for(lambda: "alert(2)" in client.get(f"/tasks/{task_id}").text, 30, "the console")
    for path in (f"/tasks/{task_id}", "/tasks", f"/compare?ids={task_id},{task_id}"):
        page = client.get(path).text
        assert "<script>alert" not in page and "<img src=x" not in page, path
        assert "</script><script>" not in page, path
    page = client.get(f"/tasks/{task_id}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the name and console, as text
    assert "\\u003cscript\\u003ealert(1)" in page  # the scalar's name, inside the chart's JSON
    stream = sse_text(client, f"/events/tasks/{task_id}?offset=0&scalars=0")
    assert "<script>alert" not in stream and "&lt;script&gt;" in stream
    listing = sse_text(client, "/events/tasks?page=first&top=0&since=0")
    assert "<script>alert" not in listing and "&lt;script&gt;" in listing


def test_pages_forbid_framing_and_foreign_scripts(host) -> None:
    client, _ = signed_in(host, host.alice)
    for path in ("/login", "/tasks", "/pools", "/usage", "/policies"):
        headers = client.get(path).headers
        assert headers["x-frame-options"] == "DENY", path
        policy = headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy, path
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert headers["x-content-type-options"] == "nosniff"
    assert client.get("/static/../../etc/passwd").status_code == 404
    assert client.get("/static/%2e%2e/ui.py").status_code == 404


def test_sign_in_sends_nowhere_but_this_server(host) -> None:
    client = httpx.Client(base_url=host.server.url, timeout=30)
    for target in ("https://evil.example/", "//evil.example/", "/\\evil.example"):
        form = client.get("/login", params={"next": target})
        login_token = re.search(r'name="login_token" value="([^"]+)"', form.text)[1]  # type: ignore[index]
        answer = client.post(
            "/login", data={"token": host.alice, "login_token": login_token, "next": target}
        )
        assert answer.status_code == 303 and answer.headers["location"] == "/", target


def test_bad_input_to_the_pages_is_a_4xx_or_a_page_never_a_5xx(host) -> None:
    client, csrf = signed_in(host, host.alice)
    huge = "9" * 30
    for path in (
        f"/tasks/{huge}",
        "/tasks/0",
        f"/tasks?before={huge}&state=bogus&state=queued&q={'x' * 5000}",
        f"/compare?ids={huge},-1,abc",
        "/usage?by=nobody&since=yesterday-ish",
        "/usage.csv?by=user&since=1e400",
        "/platform?resource=nope",
        f"/events/tasks/{huge}",
    ):
        assert client.get(path).status_code < 500, path
    assert sse_text(client, f"/events/tasks?ids={huge},x&top={huge}&since=nan", 1.5) != ""
    for path, data in (
        (f"/tasks/{huge}/cancel", {"csrf": csrf}),
        ("/tasks/cancel", {"csrf": csrf, "id": [huge, "-3", "x"]}),
        ("/policies/simulate", {"csrf": csrf, "estate_text": "resources: [unclosed"}),
    ):
        assert client.post(path, data=data).status_code < 500, path
