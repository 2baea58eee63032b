"""The web UI's errors in a real browser: a wrong address (404), a page that is not for this user
(403) and a fault in the server (500) each answer a page in the site's layout, with its menu,
what went wrong and a way back; never the API's JSON. The API keeps answering JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import HOST_ACCESS, ROOT, Server, free_port, shared_folder, stop_server, wait_for
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ESTATE = f"""
teams:
  vision: [alice]
resources:
  cpu:
    profile: {{cpus: 1, memory: 100M, walltime: 10m, pools: [host]}}
pools:
  host:
    kind: host
    slots: 1
    {HOST_ACCESS}
"""

# The real server, with one page that fails as a fault in any page would: the handler under
# test is the one every page has.
FAULTY_SERVER = """
import sys
from broker import server
from broker.cli import main

made = server.build_app

def build_app(*args, **kwargs):
    app = made(*args, **kwargs)

    @app.get("/tasks-fault")
    def fault():
        raise RuntimeError("a fault for the test: the page must not show this")

    app.router.routes.insert(0, app.router.routes.pop())  # before the catch-all /mcp mount
    return app

server.build_app = build_app
main(["server", "--estate", sys.argv[1], "--port", sys.argv[2], "--routes-port", sys.argv[3]])
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = shared_folder("klique-errors-")
    folder = tmp_path_factory.mktemp("errors")
    estate = folder / "estate.yaml"
    estate.write_text(ESTATE.replace("$JOB_ROOT", str(root)))
    home = folder / "home"
    home.mkdir()
    port = free_port()
    with (home / "server.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", FAULTY_SERVER, str(estate), str(port), str(free_port())],
            env={"PATH": "/usr/bin:/bin", "KLIQUE_HOME": str(home)},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    started = Server(f"http://127.0.0.1:{port}", home, "", process)
    try:
        wait_for(lambda: _up(started), 60, "the server to answer")
        started.token = (home / "admin.token").read_text().strip()
        yield started
    finally:
        stop_server(started)
        shutil.rmtree(root, ignore_errors=True)


def _up(server: Server) -> bool:
    assert server.process.poll() is None, (server.home / "server.log").read_text()
    token = server.home / "admin.token"
    if not token.exists():
        return False
    try:
        answer = httpx.get(
            f"{server.url}/api/v1/whoami",
            headers={"Authorization": f"Bearer {token.read_text().strip()}"},
            timeout=2,
        )
    except httpx.TransportError:
        return False
    return answer.status_code == 200


def sign_in(driver: Any, server: Server, user: str) -> None:
    driver.get(f"{server.url}/login?next=/tasks")
    driver.find_element(By.ID, "token").send_keys(server.make_token(user))
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(driver, 30).until(lambda d: d.current_url == f"{server.url}/tasks")


def error_page(driver: Any, server: Server, path: str) -> dict[str, Any]:
    """What the page at `path` shows: its heading, its message, its menu and its way back."""
    driver.get(f"{server.url}{path}")
    WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "main h1"))
    menu = [a.text for a in driver.find_elements(By.CSS_SELECTOR, "header nav a")]
    back = driver.find_elements(By.CSS_SELECTOR, "main .way-back a")
    return {
        "heading": driver.find_element(By.CSS_SELECTOR, "main h1").text,
        "message": driver.find_element(By.CSS_SELECTOR, "main [role=alert]").text,
        "menu": menu,
        "back": back[0] if back else None,
        "text": driver.find_element(By.TAG_NAME, "body").text,
    }


def test_a_wrong_address_answers_a_page_with_the_menu_and_a_way_back(server, browser) -> None:
    sign_in(browser, server, "alice")
    shown = error_page(browser, server, "/resources")
    assert shown["heading"] == "No such page 404"
    assert shown["message"] == "there is no page at /resources; the pages are in the menu above"
    assert "Tasks" in shown["menu"] and "Resources and pools" in shown["menu"]
    assert '"detail"' not in shown["text"]
    shown["back"].click()
    WebDriverWait(browser, 30).until(lambda d: d.current_url == f"{server.url}/tasks")


def test_a_wrong_address_before_signing_in_offers_to_sign_in(server, browser) -> None:
    shown = error_page(browser, server, "/no-such-page")
    assert shown["heading"] == "No such page 404" and "Tasks" in shown["menu"]
    assert shown["back"].text == "Sign in"


def test_a_page_that_is_not_for_this_user_says_so_in_the_layout(server, browser) -> None:
    sign_in(browser, server, "alice")
    shown = error_page(browser, server, "/platform")
    assert shown["heading"] == "Not for you 403"
    assert "platform team" in shown["message"] and "Tasks" in shown["menu"]
    assert shown["back"].text == "Back to your tasks"


def test_a_fault_in_a_page_answers_a_page_that_keeps_the_fault_to_the_log(server, browser) -> None:
    sign_in(browser, server, "alice")
    shown = error_page(browser, server, "/tasks-fault")
    assert shown["heading"] == "Something went wrong here 500"
    assert "not something you did" in shown["message"] and "log" in shown["message"]
    assert "a fault for the test" not in shown["text"] and "Traceback" not in shown["text"]
    assert "Tasks" in shown["menu"] and shown["back"].text == "Back to your tasks"
    log = Path(server.home / "server.log").read_text()
    assert "a fault for the test" in log  # kept where the platform team looks


def test_the_api_and_programs_keep_their_json(server) -> None:
    for path, accept in (("/api/v1/nope", "text/html"), ("/resources", "application/json")):
        answer = httpx.get(f"{server.url}{path}", headers={"Accept": accept}, timeout=30)
        assert answer.status_code == 404
        assert json.loads(answer.text) == {"detail": "Not Found"}
