"""Routes are the server's door into users' apps. A session's route opens to its owner (and
admins, sandboxed) only; a report token opens its own task's tunnel only; a caller cannot
smuggle Klique's credentials, forwarding headers or the route's cookie through the proxy, nor
climb out of /routes/ with the route's name."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import httpx
import pytest
import websockets.sync.client
from app_helpers import ECHO, echo_command, launch, stop, wait_ready
from conftest import HOST_ACCESS, TASK_PY
from websockets.exceptions import InvalidStatus

ESTATE = (
    "teams:\n  vision: [alice]\n  nlp: [bob]\n"
    "resources:\n  cpu:\n    profile: {cpus: 1, memory: 200M, walltime: 10m, pools: [p]}\n"
    f"pools:\n  p:\n    kind: host\n    slots: 4\n    {HOST_ACCESS}\n"
    "apps: {catalogue: $CATALOGUE}\n"
)


@pytest.fixture
def routes(server_factory, tmp_path: Path):
    """A server whose catalogue has a session (`echo-session`) and the `http` endpoint."""
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
    server = server_factory(ESTATE.replace("$CATALOGUE", str(catalogue)))
    return server, server.make_token("alice"), server.make_token("bob")


def get(server, path: str, token: str | None = None, **headers: str) -> httpx.Response:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    with httpx.Client(base_url=server.url, timeout=30) as http:
        return http.get(path, headers=headers)


def test_a_session_route_opens_to_its_owner_only(routes) -> None:
    server, alice, bob = routes
    task = launch(server, alice, "echo-session")
    wait_ready(server, alice, task["id"])
    path = task["path"]
    mine = get(server, path, alice)
    assert mine.status_code == 200 and mine.json()["name"] == "session"
    assert "content-security-policy" not in mine.headers
    assert get(server, path, bob).status_code == 403
    assert get(server, path, Cookie=f"klique_route={bob}").status_code == 403
    handshake = get(server, f"{path}?token={bob}")
    assert handshake.status_code == 403 and "set-cookie" not in handshake.headers
    assert get(server, path).status_code == 401
    assert get(server, path, "not-a-token").status_code == 401
    admin = get(server, path, server.token)  # admins may look, with the page sandboxed
    assert admin.status_code == 200 and "sandbox" in admin.headers["content-security-policy"]
    # Another site may link to the route, but not act through alice's cookie.
    cookie = {"Cookie": f"klique_route={alice}"}
    with httpx.Client(base_url=server.url, timeout=30, headers=cookie) as http:
        assert http.get(path, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200
        forged = http.post(path, headers={"Origin": "http://evil.example"}, content=b"x")
        assert forged.status_code == 403
        assert http.post(path, headers={"Origin": server.url}, content=b"x").status_code == 200
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
    task = launch(server, alice, "http", params={"command": echo_command("echo")})
    wait_ready(server, alice, task["id"])
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
    # One value, the server's own view of the client (uvicorn believes X-Forwarded-For only from
    # a proxy on loopback, as this test is): never the caller's list passed on.
    assert "," not in headers["x-forwarded-for"] and headers["x-klique-user"] == "alice"
    assert headers["x-forwarded-host"] == server.url.removeprefix("http://")
    assert headers["host"].startswith("127.0.0.1:") and "forwarded" not in headers
    assert alice not in json.dumps(seen)  # the Klique token never reaches the app
    assert "s3cret" not in json.dumps(seen) and "c5rf" not in json.dumps(seen)
    assert "s1gn" not in json.dumps(seen)
    planted = get(server, task["path"] + "set-cookie", alice)
    cookies = planted.headers.get_list("set-cookie")
    assert cookies == ["app_cookie=fine; Path=/"], cookies  # the app cannot set Klique's
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
    task = launch(server, alice, "http", params={"command": echo_command("echo")})
    wait_ready(server, alice, task["id"])
    assert get(server, task["path"], reader).json()["name"] == "echo"
    with httpx.Client(base_url=server.url, timeout=30) as http:
        posted = http.post(task["path"], headers={"Authorization": f"Bearer {reader}"})
        assert posted.status_code == 403 and "'submit' scope" in posted.text
        cookie = {"Cookie": f"klique_route={reader}", "Origin": server.url}
        assert http.post(task["path"], headers=cookie).status_code == 403
        assert http.post(task["path"], headers={"Authorization": f"Bearer {alice}"}).is_success
    ws_url = server.url.replace("http://", "ws://") + task["path"]
    with pytest.raises(InvalidStatus) as refused:
        websockets.sync.client.connect(
            ws_url, additional_headers={"Authorization": f"Bearer {reader}"}, open_timeout=30
        )
    assert refused.value.response.status_code == 403
    stop(server, alice, task["id"])


def _raw(server, request: str) -> bytes:
    """Everything the server answers on one connection, until it closes it."""
    import socket

    port = int(server.url.rsplit(":", 1)[1])
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
    API: every one is a 404 of the routes."""
    server, *_ = routes
    port = int(server.url.rsplit(":", 1)[1])
    body = json.dumps({"user": "mallory", "admin": True})
    headers = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
    for path in CLIMBS:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("POST", path, body=body, headers=headers)
        answer = connection.getresponse()
        assert answer.status == 404, (path, answer.status, answer.read())
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
