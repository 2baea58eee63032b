"""Routes are the server's door into users' apps. A session's route opens to its owner (and
admins, sandboxed) only; a report token opens its own task's tunnel only; a caller cannot
smuggle Klique's credentials, forwarding headers or the route's cookie through the proxy, nor
climb out of /routes/ with the route's name.

Routes live on an origin of their own (the routes listener; with a wildcard domain, a host per
route), which serves nothing else; a browser opens one with a one-time code, never a token in
the address; an app's answer reaches the browser through an allow-list of headers and a strict
reading of its cookies."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import websockets.sync.client
from conftest import HOST_ACCESS, TASK_PY
from helpers.app import ECHO, echo_command, launch, stop, wait_ready
from websockets.exceptions import InvalidStatus

from broker.route_proxy import access as route_access
from broker.route_proxy.access import RouteKeys
from broker.route_proxy.headers import kept_cookie

ESTATE = (
    "teams:\n  vision: [alice]\n  nlp: [bob]\n"
    "resources:\n  cpu:\n    profile: {cpus: 1, memory: 200M, walltime: 10m, pools: [p]}\n"
    f"pools:\n  p:\n    kind: host\n    slots: 4\n    {HOST_ACCESS}\n"
    "apps: {catalogue: $CATALOGUE}\n"
)


def catalogue_of(tmp_path: Path) -> Path:
    """A catalogue with a session (`echo-session`) and the `http` endpoint."""
    catalogue = tmp_path / "catalogue"
    catalogue.mkdir()
    session = {
        "kind": "session",
        "form": {"type": "object", "properties": {}},
        "command": [TASK_PY, "-c", ECHO, "{port}", "session"],
    }
    (catalogue / "echo-session.yaml").write_text(json.dumps(session))
    endpoint = {
        "kind": "endpoint",
        "form": {"type": "object", "properties": {"command": {"type": "array"}}},
        "command": ["{command}"],
    }
    (catalogue / "http.yaml").write_text(json.dumps(endpoint))
    return catalogue


@pytest.fixture
def routes(server_factory, tmp_path: Path):
    """A server whose routes share the routes listener's one origin."""
    server = server_factory(ESTATE.replace("$CATALOGUE", str(catalogue_of(tmp_path))))
    return server, server.make_token("alice"), server.make_token("bob")


def get(server, path: str, token: str | None = None, **headers: str) -> httpx.Response:
    """A GET on the routes' origin."""
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    with httpx.Client(base_url=server.routes_url, timeout=30) as http:
        return http.get(path, headers=headers)


def route_of(task: dict) -> str:
    return str(task["path"]).split("/")[2]


def code_url(server, token: str, name: str) -> str:
    """A one-time address that opens route `name` as the token's user (`klique app open`)."""
    with server.api(token) as api:
        made = api.post(f"/routes/{name}/code")
    assert made.status_code == 201, made.text
    assert made.json()["expires_in_s"] == 60
    return str(made.json()["url"])


@contextmanager
def opened(server, token: str, name: str) -> Iterator[httpx.Client]:
    """A browser-like client that opened route `name` with a code: it holds the route's cookie."""
    with httpx.Client(timeout=30, follow_redirects=False) as client:
        answer = client.get(code_url(server, token, name))
        assert answer.status_code == 303, answer.text
        assert "code=" not in answer.headers["location"]
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and f"Path=/routes/{name}/" in cookie
        assert "Domain" not in cookie
        yield client


def signed_in(server, token: str) -> tuple[httpx.Client, str]:
    """A browser-like client signed in to the web UI, and the CSRF token its pages carry."""
    client = httpx.Client(base_url=server.url, timeout=30, follow_redirects=False)
    form = client.get("/login").text
    login_token = re.search(r'name="login_token" value="([^"]+)"', form)[1]  # type: ignore[index]
    answer = client.post("/login", data={"token": token, "login_token": login_token})
    assert answer.status_code == 303, answer.text
    page = client.get("/tasks").text
    return client, re.search(r'name="csrf" value="([^"]+)"', page)[1]  # type: ignore[index]


def echo_app(server, token: str, name: str = "echo") -> dict:
    """An `http` endpoint answering with its `name` (helpers.app.ECHO), once its route answers."""
    task = launch(server, token, "http", params={"command": echo_command(name)})
    wait_ready(server, token, task["id"])
    return task


def test_a_session_route_opens_to_its_owner_only(routes) -> None:
    server, alice, bob = routes
    task = launch(server, alice, "echo-session")
    wait_ready(server, alice, task["id"])
    path = task["path"]
    mine = get(server, path, alice)
    assert mine.status_code == 200 and mine.json()["name"] == "session"
    assert "content-security-policy" not in mine.headers
    assert get(server, path, bob).status_code == 403
    assert get(server, path).status_code == 401
    assert get(server, path, "not-a-token").status_code == 401
    with server.api(bob) as api:  # nor will the server make bob a code for it
        assert api.post(f"/routes/{route_of(task)}/code").status_code == 403
    admin = get(server, path, server.token)  # admins may look, with the page sandboxed
    assert admin.status_code == 200 and "sandbox" in admin.headers["content-security-policy"]
    # Another site may link to the route, but not act through alice's cookie.
    with opened(server, alice, route_of(task)) as http:
        url = server.routes_url + path
        assert http.get(url, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200
        forged = http.post(url, headers={"Origin": "http://evil.example"}, content=b"x")
        assert forged.status_code == 403
        own = {"Origin": server.routes_url}
        assert http.post(url, headers=own, content=b"x").status_code == 200
    stop(server, alice, task["id"])


def _report_token(task: dict) -> str:
    return json.loads((Path(task["job_dir"]) / "task.json").read_text())["report"]["token"]


def test_a_report_token_opens_its_own_tasks_tunnel_only(routes) -> None:
    server, alice, bob = routes
    alices = launch(server, alice, "echo-session")
    bobs = launch(server, bob, "http", params={"command": echo_command("bob")})
    for task, token in ((alices, alice), (bobs, bob)):
        wait_ready(server, token, task["id"])
    token = _report_token(server.task(bobs["id"], bob))  # bob's job can read it
    ws_url = server.url.replace("http://", "ws://")
    for target in (alices["id"], 999999):
        with pytest.raises(InvalidStatus) as refused:
            websockets.sync.client.connect(
                f"{ws_url}/api/v1/tasks/{target}/tunnel",
                additional_headers={"Authorization": f"Bearer {token}"},
            )
        assert refused.value.response.status_code == 403
    batch = server.make_token("alice")  # a user's own token is no report token either
    with pytest.raises(InvalidStatus):
        websockets.sync.client.connect(
            f"{ws_url}/api/v1/tasks/{alices['id']}/tunnel",
            additional_headers={"Authorization": f"Bearer {batch}"},
        )
    assert get(server, alices["path"], alice).json()["name"] == "session"  # still alice's own
    stop(server, alice, alices["id"])
    stop(server, bob, bobs["id"])


def test_credentials_and_forwarding_headers_are_not_smuggled(routes) -> None:
    server, alice, _ = routes
    task = echo_app(server, alice)
    seen = get(
        server,
        task["path"] + "x",
        alice,
        Cookie=f"klique_route={alice}; klique_session=s3cret; other=1; klique_csrf=c5rf; "
        "klique_signin=s1gn",
        **{
            "X-Forwarded-For": "6.6.6.6",
            "X-Forwarded-Host": "evil.example",
            "X-Klique-User": "admin",
            "Forwarded": "for=6.6.6.6",
            "Proxy-Authorization": "Basic eDp5",
            "Connection": "close, X-Secret",
            "X-Secret": "kept-by-the-app",
        },
    ).json()
    headers = seen["headers"]
    assert seen["path"] == "/x"
    assert "authorization" not in headers and "proxy-authorization" not in headers
    assert headers["cookie"] == "other=1"
    # One value, the server's own view of the client (its socket's address: the server believes
    # no proxy unless told to), never the caller's list passed on.
    assert headers["x-forwarded-for"] == "127.0.0.1" and headers["x-klique-user"] == "alice"
    assert headers["x-forwarded-host"] == server.routes_url.removeprefix("http://")
    assert headers["host"].startswith("127.0.0.1:") and "forwarded" not in headers
    assert alice not in json.dumps(seen)  # the Klique token never reaches the app
    assert "s3cret" not in json.dumps(seen) and "c5rf" not in json.dumps(seen)
    assert "s1gn" not in json.dumps(seen)
    # Both lengths: refused before any route (RFC 9112 6.3 lets a server refuse such a
    # message; uvicorn's httptools parser does), and the connection closed with it.
    post = f"POST {task['path']} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {alice}\r\n"
    after = f"GET {task['path']}y HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    framed_twice = "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    answers = _raw(server, post + framed_twice + after)
    assert answers.startswith(b"HTTP/1.1 400") and answers.count(b"HTTP/1.1") == 1, answers
    assert b'"name": "echo"' not in answers, answers
    # A chunked body: the proxy re-frames the body it read, so what follows is a request to the
    # server itself (refused without a token), never a second request to the app.
    answers = _raw(server, post + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + after)
    assert answers.count(b'"name": "echo"') == 1, answers
    assert answers.count(b"HTTP/1.1 200") == 1 and b"HTTP/1.1 401" in answers, answers
    stop(server, alice, task["id"])


def test_a_read_only_token_opens_a_route_for_plain_reads_only(routes) -> None:
    """Routes keep a token's scopes as the API does: `read` may look, not act (a POST to an
    endpoint, a WebSocket to a session's kernel)."""
    server, alice, _ = routes
    with server.api() as api:
        made = api.post("/tokens", json={"user": "alice", "scopes": ["read"]})
    reader = made.json()["token"]
    task = echo_app(server, alice)
    assert get(server, task["path"], reader).json()["name"] == "echo"
    with httpx.Client(base_url=server.routes_url, timeout=30) as http:
        posted = http.post(task["path"], headers={"Authorization": f"Bearer {reader}"})
        assert posted.status_code == 403 and "'submit' scope" in posted.text
        assert http.post(task["path"], headers={"Authorization": f"Bearer {alice}"}).is_success
    with opened(server, reader, route_of(task)) as browser:  # a read token's route session
        url = server.routes_url + task["path"]
        assert browser.get(url).json()["name"] == "echo"
        assert browser.post(url, headers={"Origin": server.routes_url}).status_code == 403
    ws_url = server.routes_url.replace("http://", "ws://") + task["path"]
    with pytest.raises(InvalidStatus) as refused:
        websockets.sync.client.connect(
            ws_url, additional_headers={"Authorization": f"Bearer {reader}"}, open_timeout=30
        )
    assert refused.value.response.status_code == 403
    stop(server, alice, task["id"])


def _raw(server, request: str) -> bytes:
    """Everything the server answers on one connection, until it closes it."""
    import socket

    port = int(server.routes_url.rsplit(":", 1)[1])
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(request.encode())
        while chunk := conn.recv(65536):
            received += chunk
    return received


CLIMBS = [
    "/routes/../api/v1/tokens",
    "/routes/%2e%2e/api/v1/tokens",
    "/routes/..%2fapi%2fv1%2ftokens/",
    "/routes/echo%2f..%2f..%2fapi%2fv1%2ftokens/",
    "/routes/.hidden/",
    "/routes//api/v1/tokens",
]


def test_a_route_name_cannot_climb_out_of_routes(routes) -> None:
    """Each path, sent as written with an admin's token, would make a token if it reached the
    API: every one is a 404 of the routes, on the UI's origin and on the routes' (which serves
    no API at all)."""
    server, *_ = routes
    body = json.dumps({"user": "mallory", "admin": True})
    headers = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
    for origin in (server.url, server.routes_url):
        port = int(origin.rsplit(":", 1)[1])
        for path in [*CLIMBS, *(["/api/v1/tokens"] if origin == server.routes_url else [])]:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request("POST", path, body=body, headers=headers)
            answer = connection.getresponse()
            assert answer.status == 404, (origin, path, answer.status, answer.read())
            connection.close()
    with server.api() as api:  # the API works, and made no token for anyone
        assert api.post("/tokens", json={"user": "x"}).status_code == 201


def test_route_names_in_requests_are_names(routes) -> None:
    server, alice, _ = routes
    with server.api(alice) as api:
        bad = api.post("/apps/http/launch", json={"route": "../x", "params": {"command": ["a"]}})
        assert bad.status_code == 422
    with server.api() as api:
        assert api.post("/routes", json={"name": "a/b"}).status_code == 422
        assert api.put("/apps/..%2f..%2fx/lock", json={"reason": "r"}).status_code in (404, 422)


# The origin model (SECURITY.md, "Routes live on an origin of their own").


def test_a_link_to_a_route_cannot_take_over_a_colleague(routes) -> None:
    """Bob sends alice a link to his session's route. Before, `?token=BOB` put bob's token in
    her route cookie, and bob's page ran on Klique's own origin beside her UI session: it read
    `klique_csrf` and acted as her. Now the UI's origin serves no app content (only a redirect),
    the routes' origin serves no UI or API, her session's CSRF token is in no cookie, and the UI
    sends her on with a code of her own only to a route she may open."""
    server, alice, bob = routes
    task = launch(server, bob, "echo-session")
    wait_ready(server, bob, task["id"])
    path = task["path"]
    browser, csrf = signed_in(server, alice)
    assert "klique_csrf" not in browser.cookies  # no script-readable cookie holds the token
    sent = browser.get(f"{path}?token={bob}&tab=1")  # the link, as sent, on the UI's origin
    assert sent.status_code == 303 and '"name"' not in sent.text
    location = sent.headers["location"]
    assert location == f"{server.routes_url}{path}?tab=1", location  # no token, no code for her
    # On the routes' origin: the token in the address is refused, with how to open a route.
    refused = browser.get(f"{server.routes_url}{path}?token={bob}")
    assert refused.status_code == 400 and "klique app open" in refused.text
    assert "set-cookie" not in refused.headers
    # A code bob made for his route: not in a browser signed in as alice.
    taken = browser.get(code_url(server, bob, route_of(task)))
    assert taken.status_code == 403 and "signed in as alice" in taken.text
    assert "set-cookie" not in taken.headers
    # Her UI session does not reach the API or the UI through the routes' origin.
    for where in ("/api/v1/whoami", "/tasks", "/"):
        answer = browser.get(server.routes_url + where, headers={"X-Klique-CSRF": csrf})
        assert answer.status_code == 404, (where, answer.text)
    made = browser.post(
        server.routes_url + "/api/v1/tasks",
        json={"name": "x", "resource": "cpu", "command": ["true"]},
        headers={"X-Klique-CSRF": csrf},
    )
    assert made.status_code == 404
    # Alice's own route: the UI sends her on with a code that signs her in to it alone.
    mine = launch(server, alice, "echo-session")
    wait_ready(server, alice, mine["id"])
    sent = browser.get(mine["path"])
    assert sent.status_code == 303 and "code=" in sent.headers["location"]
    page = browser.get(sent.headers["location"])
    assert page.status_code == 303 and "code=" not in page.headers["location"]
    assert browser.get(server.routes_url + mine["path"]).json()["name"] == "session"
    assert browser.get(server.routes_url + path).status_code == 401  # bob's: not with hers
    browser.close()
    stop(server, alice, mine["id"])
    stop(server, bob, task["id"])


def test_a_token_in_a_route_address_or_cookie_is_refused(routes) -> None:
    server, alice, _ = routes
    task = echo_app(server, alice)
    answer = get(server, f"{task['path']}?token={alice}")
    assert answer.status_code == 400 and "set-cookie" not in answer.headers
    assert "klique app open" in answer.json()["detail"]
    # Nor is a token a route session: the cookie names one, made by the routes' origin.
    assert get(server, task["path"], Cookie=f"klique_route={alice}").status_code == 401
    assert get(server, task["path"], alice).json()["name"] == "echo"  # programs: a bearer
    stop(server, alice, task["id"])


def test_a_route_code_is_single_use_and_opens_its_own_route_only(routes) -> None:
    server, alice, _ = routes
    one = launch(server, alice, "http", params={"command": echo_command("one")})
    two = launch(server, alice, "http", params={"command": echo_command("two")})
    for task in (one, two):
        wait_ready(server, alice, task["id"])
    opened_by_cli = server.cli("app", "open", str(one["id"]), token=alice)
    url = opened_by_cli.output.splitlines()[0]  # what `klique app open ID` prints
    assert url.startswith(f"{server.routes_url}/routes/{route_of(one)}/?code="), url
    with httpx.Client(timeout=30, follow_redirects=True) as first:
        assert first.get(url).json()["name"] == "one"  # the code, the cookie, the page
        cookie = first.cookies["klique_route"]
    with httpx.Client(timeout=30, follow_redirects=False) as second:
        again = second.get(url)
        assert again.status_code == 401 and "set-cookie" not in again.headers
        assert "used" in again.json()["detail"]
    # A code for one route does not open another, nor does the cookie it was exchanged for.
    other = code_url(server, alice, route_of(one)).replace(
        f"/routes/{route_of(one)}/", f"/routes/{route_of(two)}/"
    )
    with httpx.Client(timeout=30, follow_redirects=False) as third:
        assert third.get(other).status_code == 401
    assert get(server, two["path"], Cookie=f"klique_route={cookie}").status_code == 401
    assert get(server, one["path"], Cookie=f"klique_route={cookie}").json()["name"] == "one"
    for task in (one, two):
        stop(server, alice, task["id"])


def test_a_route_code_expires_after_a_minute(monkeypatch) -> None:
    from broker.identity.resolve import Caller

    now = [1000.0]
    monkeypatch.setattr(route_access.time, "time", lambda: now[0])
    keys = RouteKeys()
    alice = Caller("alice", False)
    late, timely = keys.mint(alice, "r"), keys.mint(alice, "r")
    now[0] += 59
    session = keys.exchange(timely, "r")
    found = keys.session(session, "r") if session is not None else None
    assert found is not None and found.caller == alice
    assert keys.session(session, "other") is None  # bound to its route
    assert keys.exchange(timely, "r") is None  # used
    now[0] += 2
    assert keys.exchange(late, "r") is None  # 61 s old
    assert keys.exchange(keys.mint(alice, "r"), "other") is None  # another route's
    now[0] += route_access.SESSION_TTL_S
    assert keys.session(session, "r") is None  # the route session ends too


def test_a_route_session_ends_with_the_token_that_opened_it(routes) -> None:
    server, alice, _ = routes
    task = echo_app(server, alice)
    with server.api() as api:
        made = api.post("/tokens", json={"user": "alice"}).json()
    with opened(server, made["token"], route_of(task)) as browser:
        url = server.routes_url + task["path"]
        assert browser.get(url).json()["name"] == "echo"
        with server.api() as api:
            assert api.post(f"/tokens/{made['id']}/revoke").status_code == 200
        assert browser.get(url).status_code == 401
    stop(server, alice, task["id"])


def test_a_route_shown_to_anyone_but_its_owner_is_sandboxed(routes) -> None:
    server, alice, bob = routes
    session = launch(server, alice, "echo-session")
    endpoint = launch(server, alice, "http", params={"command": echo_command("echo")})
    for task in (session, endpoint):
        wait_ready(server, alice, task["id"])
    with opened(server, alice, route_of(session)) as own:
        page = own.get(server.routes_url + session["path"])
        assert page.status_code == 200 and "content-security-policy" not in page.headers
    with opened(server, server.token, route_of(session)) as admin:
        page = admin.get(server.routes_url + session["path"])
        assert "sandbox" in page.headers["content-security-policy"]
    with opened(server, alice, route_of(endpoint)) as owner:  # an endpoint's page: always
        page = owner.get(server.routes_url + endpoint["path"])
        assert "sandbox" in page.headers["content-security-policy"]
    for task in (session, endpoint):
        stop(server, alice, task["id"])


def test_an_apps_headers_and_cookies_pass_an_allow_list(routes) -> None:
    """An app answered `Set-Cookie: =klique_session=X` (a nameless cookie, which browsers keep
    as `klique_session=X`): alice's next request to the UI spoke as bob. Klique's names in any
    guise, cookies for a domain or a path outside the route, Clear-Site-Data and headers not
    on the allow-list never reach the browser."""
    server, alice, _ = routes
    task = echo_app(server, alice)
    answer = get(server, task["path"] + "set-cookie", alice)
    cookies = answer.headers.get_list("set-cookie")
    assert cookies == ["app_cookie=fine", f"app_path=1; Path={task['path']}"], cookies
    assert "clear-site-data" not in answer.headers and "x-klique-user" not in answer.headers
    assert answer.headers["content-type"] == "application/json"
    stop(server, alice, task["id"])


@pytest.mark.parametrize(
    ("header", "kept"),
    [
        ("a=1", "a=1"),
        (
            "a=1; Path=/routes/r/x; HttpOnly; SameSite=Lax",
            "a=1; Path=/routes/r/x; HttpOnly; SameSite=Lax",
        ),
        ('a="q"; Max-Age=60; Secure', 'a="q"; Max-Age=60; Secure'),
        (
            "a=1; Expires=Wed, 21 Oct 2037 07:28:00 GMT",
            "a=1; Expires=Wed, 21 Oct 2037 07:28:00 GMT",
        ),
        ("=klique_session=X", None),
        ("=x", None),
        ("klique_session=X", None),
        ("Klique_Route=X", None),
        ("__Host-klique_session=X; Path=/; Secure", None),
        ("klique_anything=X", None),
        ("a=1; Domain=example.org", None),
        ("a=1; domain=", None),
        ("a=1; Path=/", None),
        ("a=1; Path=/routes/other/", None),
        ("a=1; Path=/routes/rx", None),
        ("a=1; Path=/routes/r/; Path=/", None),
        ("a b=1", None),
        ("a=1 2", None),
        ("a=1; Frobnicate", None),
        ("a=1\r\nSet-Cookie: klique_session=X", None),
        ("no-equals", None),
    ],
)
def test_an_apps_cookie_is_read_strictly(header: str, kept: str | None) -> None:
    assert kept_cookie(header, "r", own_host=False) == kept


def test_on_a_host_of_its_own_any_path_is_inside_the_route() -> None:
    assert kept_cookie("a=1; Path=/", "r", own_host=True) == "a=1; Path=/"
    assert kept_cookie("klique_route=1; Path=/", "r", own_host=True) is None
    assert kept_cookie("a=1; Domain=r.routes.test", "r", own_host=True) is None


def test_routes_sharing_an_origin_do_not_reach_each_other(routes) -> None:
    """Without a wildcard domain, routes share the routes listener's origin: a request that the
    browser says comes from that origin must come from the route's own pages (its Referer)."""
    server, alice, _ = routes
    one = launch(server, alice, "http", params={"command": echo_command("one")})
    two = launch(server, alice, "http", params={"command": echo_command("two")})
    for task in (one, two):
        wait_ready(server, alice, task["id"])
    with opened(server, alice, route_of(two)) as browser:
        url = server.routes_url + two["path"]
        own = {"Sec-Fetch-Site": "same-origin", "Referer": url + "page"}
        assert browser.get(url, headers=own).json()["name"] == "two"
        from_one = {"Sec-Fetch-Site": "same-origin", "Referer": server.routes_url + one["path"]}
        assert browser.get(url, headers=from_one).status_code == 403
        unsaid = {"Sec-Fetch-Site": "same-origin"}  # a page that sends no Referer
        assert browser.get(url, headers=unsaid).status_code == 403
        assert browser.get(url, headers={"Sec-Fetch-Site": "none"}).status_code == 200
    for task in (one, two):
        stop(server, alice, task["id"])


def test_with_a_wildcard_domain_each_route_has_a_host_of_its_own(server_factory, tmp_path) -> None:
    estate = ESTATE.replace("$CATALOGUE", str(catalogue_of(tmp_path)))
    server = server_factory(estate, server_args=["--routes-domain", "routes.test"])
    alice = server.make_token("alice")
    one = echo_app(server, alice, "one")
    name, port = route_of(one), server.routes_url.rsplit(":", 1)[1]
    url = code_url(server, alice, name)
    assert url.startswith(f"http://{name}.routes.test:{port}/routes/{name}/?code="), url
    own_host = {"Host": f"{name}.routes.test:{port}"}
    with httpx.Client(base_url=server.routes_url, timeout=30, follow_redirects=False) as http:
        answer = http.get(url.split(port, 1)[1], headers=own_host)
        assert answer.status_code == 303 and "Domain" not in answer.headers["set-cookie"]
        page = http.get(one["path"] + "set-cookie", headers=own_host)
        assert page.json()["name"] == "one"
        assert "wide=1; Path=/" in page.headers.get_list("set-cookie")  # its own host's
        assert "klique_route" not in page.text  # the cookie never reaches the app
        wrong = http.get(one["path"], headers={"Host": f"other.routes.test:{port}"})
        assert wrong.status_code == 404 and f"{name}.routes.test" in wrong.text
        assert http.get("/", headers=own_host).headers["location"] == one["path"]
    stop(server, alice, one["id"])
