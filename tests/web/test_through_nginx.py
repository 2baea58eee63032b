"""The UI through nginx as a site deploys it (deploy/nginx/klique.conf run by scripts/nginx-up):
over HTTPS at https://klique.test, a signed-in page whose live connection (an event stream)
follows a task to its end, the server believing nginx's forwarding headers (the session cookie
is Secure), plain HTTP sent on to HTTPS, and a body over the server's limit answered by the
server's own sentence, not nginx's page; and JupyterLab through its route host, its kernel
running 1+1 over a WebSocket that nginx upgrades. Jobs reach the server through nginx as well
(its public URL is nginx's): a task's reports, and an app's route tunnel that a browser opens.
The route-origin tests through nginx are in test_route_origins.py."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import HOST_ACCESS_SETTINGS, TASK_PY, free_port, submitted_id, wait_for
from helpers.app import RUN_ONE_PLUS_ONE, chromium, echo_command, launch, stop, wait_ready
from helpers.estates import estate_yaml, profile
from helpers.identity import CA
from helpers.proxy import Front, nginx_front, server_args
from selenium.webdriver.common.by import By

from .conftest import _chromium
from .test_browser import live, row_state, until


@pytest.fixture
def site(server_factory, tmp_path: Path) -> Iterator[tuple[Any, Front]]:
    """A server with a host pool, and nginx in front of it."""
    _chromium()
    estate = estate_yaml(
        teams={"vision": ["alice"]},
        resources={"cpu": profile("p", cpus=1, memory="2G", walltime="20m")},
        pools={"p": {"kind": "host", "slots": 2, **HOST_ACCESS_SETTINGS}},
    )
    port = free_port()
    # Jobs report to nginx, as at a site: their public URL is nginx's, over HTTPS with the test
    # CA's certificate, which the runners trust as the server does (SSL_CERT_FILE).
    jobs_url = ["--public-url", f"https://127.0.0.1:{port}"]
    server = server_factory(
        estate, server_args=[*server_args(port), *jobs_url], SSL_CERT_FILE=str(CA)
    )
    with nginx_front(server, port, free_port()) as front:
        yield server, front


def through_nginx(front: Front, task_id: int, what: str) -> list[str]:
    """nginx's log lines of a job's requests to `/api/v1/tasks/ID/WHAT` (the runner's own)."""
    log = (front.folder / "access.log").read_text()
    return [line for line in log.splitlines() if f" /api/v1/tasks/{task_id}/{what}" in line]


def test_a_live_page_follows_a_task_over_https_through_nginx(site) -> None:
    server, front = site
    alice = server.make_token("alice")
    with chromium(*front.chromium_flags()) as browser:
        browser.get(f"{front.url}/login?next=/tasks")
        browser.find_element(By.ID, "token").send_keys(alice)
        browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
        until(browser, lambda d: d.current_url == f"{front.url}/tasks", "the tasks page", 30)
        # nginx said the request came over HTTPS, and the server believed it (it names nginx in
        # --forwarded-allow-ips): the session cookie is for HTTPS only.
        assert browser.get_cookie("klique_session")["secure"]
        live(browser)
        script = "print('through nginx')"
        ran = server.cli("submit", "--no-code", "--json", "-r", "cpu", "-n", "proxied", "--",
                         TASK_PY, "-c", script, token=alice)  # fmt: skip
        task_id = submitted_id(ran)
        # No reload: the row arrives over the page's event stream, through nginx, to its end.
        until(browser, lambda d: row_state(d, task_id), f"task {task_id} to appear")
        until(browser, lambda d: row_state(d, task_id) == "completed", f"task {task_id} done")
    # The job told the server its end through nginx too, over HTTPS (its public URL).
    assert any('" 200 ' in line for line in through_nginx(front, task_id, "report"))


def test_plain_http_is_sent_to_https_and_the_servers_limit_speaks(site) -> None:
    server, front = site
    sent_on = httpx.get(
        f"http://127.0.0.1:{front.http_port}/tasks", headers={"Host": "klique.test"}, timeout=10
    )
    assert sent_on.status_code == 301
    assert sent_on.headers["location"] == f"{front.url}/tasks"

    trusting = ssl.create_default_context(cafile=str(CA))
    big = b"x" * (32 * 1024 * 1024 + 1)  # one byte over the server's default limits.max_request
    with httpx.Client(verify=trusting, timeout=60) as client:
        answer = client.post(
            f"https://127.0.0.1:{front.port}/api/v1/tasks",
            content=big,
            headers={
                "Host": f"klique.test:{front.port}",
                "Authorization": f"Bearer {server.token}",
            },
            extensions={"sni_hostname": "klique.test"},
        )
    assert answer.status_code == 413
    assert "limits.max_request" in answer.text, answer.text


def test_an_app_opens_through_its_route_and_tunnel_via_nginx(site) -> None:
    server, front = site
    alice = server.make_token("alice")
    started = launch(
        server, alice, "http", resource="cpu", params={"command": echo_command("tunnelled")}
    )
    task_id, route = started["id"], started["path"]
    wait_ready(server, alice, task_id)
    name = route.split("/")[2]
    with server.api(alice) as api:
        made = api.post(f"/routes/{name}/code")
    assert made.status_code == 201, made.text
    with chromium(*front.chromium_flags()) as browser:
        browser.get(made.json()["url"])
        browser.get(f"{front.route(name)}{route}page")
        # Browser, nginx, the routes listener, the tunnel (nginx again), the app on the node.
        until(browser, lambda d: d.find_element(By.TAG_NAME, "p").text == "tunnelled", "the app")
    stop(server, alice, task_id)
    # The runner's end of the route was its WebSocket to the server's public URL, upgraded by
    # nginx (which logs an upgraded connection once it closes, at the app's stop).
    wait_for(
        lambda: any('" 101 ' in line for line in through_nginx(front, task_id, "tunnel")),
        60,
        "nginx to log the tunnel's WebSocket",
    )


@pytest.mark.long
def test_jupyterlab_runs_its_kernel_through_nginx(site) -> None:
    server, front = site
    alice = server.make_token("alice")
    started = launch(server, alice, "jupyter", resource="cpu")
    task_id, route = started["id"], started["path"]
    wait_ready(server, alice, task_id, 300)  # the first build downloads JupyterLab
    name = route.split("/")[2]
    with server.api(alice) as api:
        made = api.post(f"/routes/{name}/code")
    assert made.status_code == 201, made.text
    opened = made.json()["url"]
    assert opened.startswith(front.route(name)), opened  # the server names nginx's address
    with chromium(*front.chromium_flags()) as browser:
        browser.get(opened)
        browser.get(f"{front.route(name)}{route}lab")
        wait_for(
            lambda: browser.execute_script("return !!document.querySelector('.jp-Launcher')"),
            120,
            "JupyterLab's launcher to show",
            0.5,
        )
        # The kernel's WebSocket: browser, nginx (upgraded), the routes listener, the tunnel
        # (the runner's WebSocket, through nginx too).
        assert browser.execute_async_script(RUN_ONE_PLUS_ONE, route) == "2"
    stop(server, alice, task_id)
