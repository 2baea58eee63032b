"""Attacks through what a task reports beyond scalars: a job's report token speaking for
another task, an "image" whose bytes are an HTML page, a markdown text with a script, and a
flood of reports. Each report goes through the task's own token and bounds; what it holds
never runs in a browser."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Server, wait_for

from .conftest import host_estate

MAX_REPORTS = 5
HTML = b"<html><body><script>fetch('/api/v1/tasks').then(r => r.text())</script></body></html>"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg=="
)
XSS = "<script>alert(1)</script><img src=x onerror=alert(2)> [click](javascript:alert(3))"


@pytest.fixture(scope="module")
def server(module_server_factory) -> Server:
    limits = f"limits:\n  max_reports: {MAX_REPORTS}\n"
    return module_server_factory(host_estate() + limits)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def tokens(server: Server) -> dict[str, str]:
    return {user: server.make_token(user) for user in ("alice", "bob")}


def local_run(server: Server, token: str) -> tuple[int, str]:
    """A run recorded where it runs (Task.init's): its id and report token."""
    with server.api(token) as api:
        answer = api.post("/sdk/tasks", json={"command": ["python3", "x.py"], "name": "r"})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"], answer.json()["report_token"]


def report(server: Server, task_id: int, token: str, *items: dict) -> httpx.Response:
    with httpx.Client(base_url=server.url + "/api/v1", timeout=30) as api:
        return api.post(
            f"/tasks/{task_id}/report",
            json={"reports": list(items)},
            headers={"Authorization": f"Bearer {token}"},
        )


def text(markdown: str) -> dict:
    return {"kind": "text", "title": "notes", "data": {"text": markdown, "markdown": True}}


def image(content: bytes) -> dict:
    encoded = base64.b64encode(content).decode()
    return {"kind": "image", "title": "x", "content": encoded, "content_type": "image/png"}


@pytest.fixture(scope="module")
def bobs_job(server: Server, tokens: dict[str, str]) -> Iterator[tuple[int, str]]:
    """A job of bob's, running, and the report token it reads from its task.json."""
    with server.api(tokens["bob"]) as api:
        answer = api.post("/tasks", json={"command": ["sleep", "600"]})
    task_id = answer.json()["id"]
    task = server.wait_state(task_id, {"running"}, token=tokens["bob"])
    spec = json.loads((Path(task["job_dir"]) / "task.json").read_text())
    yield task_id, spec["report"]["token"]
    server.cli("cancel", str(task_id), token=tokens["bob"])


def test_a_jobs_report_token_reports_to_its_own_task_only(server, tokens, bobs_job) -> None:
    alices, _ = local_run(server, tokens["alice"])
    bobs, token = bobs_job
    on_alices = report(server, alices, token, text("planted by bob"))
    on_his_own = report(server, bobs, token, text("his own"))
    assert on_alices.status_code == 401, on_alices.text
    assert on_his_own.status_code == 200, on_his_own.text
    with server.api(tokens["alice"]) as api:
        assert api.get(f"/tasks/{alices}/reports").json() == []
    with server.api(tokens["bob"]) as api:
        assert api.get(f"/tasks/{alices}/reports").status_code == 404
        assert [r["data"]["text"] for r in api.get(f"/tasks/{bobs}/reports").json()] == ["his own"]


def test_an_image_whose_bytes_are_html_is_served_as_an_opaque_download(server, tokens) -> None:
    task_id, token = local_run(server, tokens["bob"])
    assert report(server, task_id, token, image(HTML), image(PNG)).status_code == 200
    with server.api(tokens["bob"]) as api:
        files = [r["file"] for r in api.get(f"/tasks/{task_id}/reports").json()]
        html, png = (api.get(f.removeprefix("/api/v1")) for f in files)
    assert html.status_code == 200 and html.content == HTML
    assert html.headers["content-type"] == "application/octet-stream"
    assert html.headers["content-disposition"].startswith("attachment")
    assert html.headers["x-content-type-options"] == "nosniff"
    assert "sandbox" in html.headers["content-security-policy"]
    assert png.headers["content-type"] == "image/png" and "content-disposition" not in png.headers


def test_a_markdown_text_with_a_script_is_shown_as_text(server, tokens) -> None:
    task_id, token = local_run(server, tokens["alice"])
    assert report(server, task_id, token, text(XSS)).status_code == 200
    browser = httpx.Client(base_url=server.url, timeout=30)
    form = browser.get("/login").text
    login = re.search(r'name="login_token" value="([^"]+)"', form)[1]  # type: ignore[index]
    browser.post("/login", data={"token": tokens["alice"], "login_token": login})
    page = browser.get(f"/tasks/{task_id}").text
    browser.close()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, page
    assert "<script>alert" not in page and "<img src=x" not in page
    assert 'href="javascript:' not in page


FLOOD = """
import klique
log = klique.Task.init().get_logger()
for i in range({n}):
    log.report_text("report %d" % i, title="flood")
print("flooded", flush=True)
"""


def test_a_flood_of_reports_stops_at_the_bound_with_the_reason_in_the_console(
    server, tokens
) -> None:
    script = FLOOD.format(n=3 * MAX_REPORTS)
    with server.api(tokens["alice"]) as api:
        answer = api.post("/tasks", json={"command": ["python3", "-c", script]})
    task_id = answer.json()["id"]
    task = server.wait_state(task_id, token=tokens["alice"])

    def stopped() -> str | None:
        logs = server.cli("logs", str(task_id), token=tokens["alice"]).output
        return logs if "reports stopped" in logs else None

    logs = wait_for(stopped, 30, "the reason in the console")
    assert task["state"] == "completed" and "flooded" in logs, (task, logs)
    assert (
        f"klique: reports stopped: task {task_id} would have {MAX_REPORTS + 1} text reports, "
        f"over {MAX_REPORTS}" in logs
    ), logs
    assert "limits.max_reports" in logs
    with server.api(tokens["alice"]) as api:
        kept = api.get(f"/tasks/{task_id}/reports", params={"kind": "text"}).json()
    assert [r["data"]["text"] for r in kept] == [f"report {i}" for i in range(MAX_REPORTS)]
