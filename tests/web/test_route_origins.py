"""Routes on their own origin, in a real browser (Debian's headless Chromium): the page of an app,
shown to its own owner (unsandboxed) on the route's host under a wildcard domain, tries what the
page behind bob's link could when routes shared the UI's origin: read Klique's cookies, call the
API as the viewer, and read another of the viewer's routes. The browser's own origin rules
refuse each. Without a wildcard domain (routes on the second listener, one origin for all),
the API is still another origin, and the proxy refuses one route's page asking another. The
wildcard case runs twice: against the server itself, and through nginx over HTTPS as a site
deploys it (deploy/nginx/klique.conf, scripts/nginx-up)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import HOST_ACCESS_SETTINGS, TASK_PY, free_port, wait_for
from helpers.app import chromium, echo_command, launch, stop, wait_ready
from helpers.estates import estate_yaml, profile
from helpers.proxy import need_nginx, nginx_front, server_args
from selenium.webdriver.common.by import By

from .conftest import _chromium

DOMAIN = "routes.test"
# Run in the app's page: each attempt answers what the page got, or "refused" when the browser
# refused it (a fetch that CORS refuses rejects with a TypeError).
ATTEMPT = """
const [url, init, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
fetch(url, init).then(r => r.text().then(t => done(r.status + " " + t)), () => done("refused"));
"""


@dataclass(frozen=True)
class View:
    """Where the browser finds the UI and each route, and the flags that let it get there."""

    ui: str
    route: Callable[[str], str]  # a route's origin, by name
    flags: list[str] = field(default_factory=list)


@pytest.fixture(params=["direct", "nginx"])
def site(request, server_factory, tmp_path: Path) -> Iterator[tuple[Any, str, View]]:
    """A server with routes under a wildcard domain, alice's token, and the browser's view of
    it: the server's own listeners (routes.test), or nginx in front over HTTPS."""
    _chromium()
    if request.param == "direct":
        server = server_factory(estate(tmp_path), server_args=["--routes-domain", DOMAIN])
        port = server.routes_url.rsplit(":", 1)[1]
        flags = [f"--host-resolver-rules=MAP *.{DOMAIN} 127.0.0.1"]
        yield (
            server,
            server.make_token("alice"),
            View(server.url, lambda name: f"http://{name}.{DOMAIN}:{port}", flags),
        )
        return
    need_nginx()
    port = free_port()
    server = server_factory(estate(tmp_path), server_args=server_args(port))
    with nginx_front(server, port, free_port()) as front:
        yield (
            server,
            server.make_token("alice"),
            View(front.url, front.route, front.chromium_flags()),
        )


def estate(folder: Path) -> str:
    """A host pool, and a catalogue whose `echo-session` is the echo app named by `name`."""
    catalogue = folder / "catalogue"
    catalogue.mkdir()
    session = {
        "kind": "session",
        "form": {"type": "object", "properties": {"name": {"type": "string"}}},
        "command": [TASK_PY, "-c", echo_command("x")[2], "{port}", "{name}"],
    }
    (catalogue / "echo-session.yaml").write_text(json.dumps(session))
    return estate_yaml(
        teams={"vision": ["alice"]},
        resources={"cpu": profile("p", cpus=1, memory="200M", walltime="10m")},
        pools={"p": {"kind": "host", "slots": 4, **HOST_ACCESS_SETTINGS}},
        apps={"catalogue": str(catalogue)},
    )


def signed_in(browser: Any, ui: str, token: str) -> None:
    browser.get(f"{ui}/login?next=/apps")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait_for(lambda: browser.current_url == f"{ui}/apps", 30, "the apps page")


def test_an_apps_page_cannot_reach_klique_or_another_route(site) -> None:
    server, alice, view = site
    mine = launch(server, alice, "echo-session", params={"name": "mine"})
    other = launch(server, alice, "echo-session", params={"name": "other"})
    for task in (mine, other):
        wait_ready(server, alice, task["id"])

    def address(task: dict[str, Any], rest: str = "") -> str:
        name = task["path"].split("/")[2]
        return f"{view.route(name)}{task['path']}{rest}"

    with chromium(*view.flags) as browser:
        signed_in(browser, view.ui, alice)
        # The UI's own page holds no script-readable cookie: the CSRF token is in the page.
        assert "klique_" not in browser.execute_script("return document.cookie")
        # Opened from the UI, as the apps page's link does: each on its own host, by a code.
        for task in (other, mine):
            browser.get(f"{view.ui}{task['path']}page")
            wait_for(lambda t=task: browser.current_url == address(t, "page"), 30, "the route")
        assert browser.find_element(By.TAG_NAME, "p").text == "mine"

        # The app's page sets a cookie of its own (document.cookie works), but sees none of
        # Klique's: the route's is HttpOnly, the UI's are another host's.
        set_cookie = browser.execute_async_script(ATTEMPT, address(mine, "set-cookie"), {})
        assert set_cookie.startswith("200 ")
        cookies = browser.execute_script("return document.cookie")
        assert "app_cookie=fine" in cookies and "klique" not in cookies.lower(), cookies

        # The API as the viewer: refused by CORS; a write sent blind carries no session.
        whoami = {"credentials": "include"}
        assert browser.execute_async_script(ATTEMPT, f"{view.ui}/api/v1/whoami", whoami) == (
            "refused"
        )
        blind = {
            "method": "POST",
            "credentials": "include",
            "mode": "no-cors",
            "body": json.dumps({"name": "from-an-app", "resource": "cpu", "command": ["true"]}),
        }
        browser.execute_async_script(ATTEMPT, f"{view.ui}/api/v1/tasks", blind)
        with server.api(alice) as api:
            names = [t["name"] for t in api.get("/tasks").json()]
        assert "from-an-app" not in names

        # Another of alice's routes, which this browser has open: refused by CORS.
        assert browser.execute_async_script(ATTEMPT, address(other), whoami) == "refused"
        # ...while the same request from that route's own page is answered (the cookie works).
        browser.get(address(other, "page"))
        assert browser.execute_async_script(ATTEMPT, address(other), whoami).startswith("200 ")
    for task in (mine, other):
        stop(server, alice, task["id"])


def test_without_a_wildcard_domain_a_routes_page_cannot_read_another_route(
    server_factory, tmp_path: Path
) -> None:
    """Routes on the second listener share one origin: the browser lets one route's page ask
    another's, so the proxy refuses a request whose Referer is not the route's own page."""
    _chromium()
    server = server_factory(estate(tmp_path))
    alice = server.make_token("alice")
    mine = launch(server, alice, "echo-session", params={"name": "mine"})
    other = launch(server, alice, "echo-session", params={"name": "other"})
    for task in (mine, other):
        wait_ready(server, alice, task["id"])
    with chromium() as browser:
        signed_in(browser, server.url, alice)
        for task in (other, mine):
            browser.get(f"{server.url}{task['path']}page")
            want = f"{server.routes_url}{task['path']}page"
            wait_for(lambda w=want: browser.current_url == w, 30, "the route")
        browser.refresh()  # a reload of the route's page still opens it
        assert browser.find_element(By.TAG_NAME, "p").text == "mine"
        same = {"credentials": "include"}
        own = browser.execute_async_script(ATTEMPT, f"{server.routes_url}{mine['path']}", same)
        assert own.startswith("200 "), own
        theirs = browser.execute_async_script(ATTEMPT, f"{server.routes_url}{other['path']}", same)
        assert theirs.startswith("403 ") and "another route's page" in theirs, theirs
        quiet = {**same, "referrerPolicy": "no-referrer"}
        hidden = browser.execute_async_script(ATTEMPT, f"{server.routes_url}{other['path']}", quiet)
        assert hidden.startswith("403 "), hidden
        # The API, on the UI's port: another origin, refused by CORS.
        whoami = browser.execute_async_script(ATTEMPT, f"{server.url}/api/v1/whoami", same)
        assert whoami == "refused"
    for task in (mine, other):
        stop(server, alice, task["id"])
