"""Reports beyond scalars end to end: a script with ClearML's names, sent to the host pool,
reports every kind (SDK -> the runner's reporter -> the server's store); the API returns each,
with its image's bytes, and the task page shows them all."""

from __future__ import annotations

import base64

import pytest
from conftest import HOST_ACCESS_SETTINGS
from helpers.sdk import estate, recorded_id, trusted_checkout
from helpers.web_session import signed_in

HOST_POOL = {"kind": "host", "slots": 2, **HOST_ACCESS_SETTINGS}


@pytest.fixture(scope="module")
def checkout():
    with trusted_checkout() as made:
        yield made


@pytest.fixture(scope="module")
def host(module_server_factory):
    server = module_server_factory(estate("p", HOST_POOL))
    return server, server.make_token("alice")


KINDS = ["histogram", "image", "media", "plot", "single", "table", "text"]


def test_every_kind_of_report_reaches_the_api_and_the_task_page(host, checkout):
    server, token = host
    done = checkout.run(server, token, "reports.py", "--remote", "cpu")
    assert done.returncode == 0, done.stdout + done.stderr
    task_id = recorded_id(done.stdout)
    task = server.wait_state(task_id, token=token)
    logs = server.cli("logs", str(task_id), token=token).output
    assert task["state"] == "completed" and task["pool"] == "p", (task, logs)
    assert f"reported {task_id}" in logs, logs
    lines = {(s["name"], s["series"]) for s in task["scalars"]}
    assert lines == {("loss", "train"), ("loss", "validation")}

    with server.api(token) as api:
        reports = api.get(f"/tasks/{task_id}/reports").json()
        images = api.get(f"/tasks/{task_id}/reports", params={"kind": "image"}).json()
        image = api.get(images[0]["file"].removeprefix("/api/v1"))
    assert sorted({r["kind"] for r in reports}) == KINDS, reports
    by_kind = {r["kind"]: r for r in reports}
    assert by_kind["single"]["data"] == {"value": 0.93}
    assert by_kind["table"]["data"] == {"columns": ["class", "f1"], "rows": [["cat", 0.8]]}
    assert by_kind["histogram"]["data"]["values"] == [3.0, 5.0, 2.0]
    assert [(i["series"], i["iteration"]) for i in images] == [("val", 0), ("val", 1)]
    assert image.status_code == 200 and image.headers["content-type"] == "image/png"
    assert image.content[:8] == base64.b64decode("iVBORw0KGgo=")
    assert by_kind["media"]["file"] and by_kind["media"]["data"]["name"] == "clip.wav"

    browser = signed_in(server, token)
    page = browser.get(f"/tasks/{task_id}").text
    browser.close()
    for heading in ("Single values", "Tables", "Images", "Plots", "Histograms", "Text", "Media"):
        assert f">{heading}</h2>" in page, heading
    assert "accuracy" in page and "<td>cat</td>" in page and 'id="histogram-data"' in page
    assert images[-1]["file"] in page and "data-image-slider" in page  # the newest, a slider
    assert "<h2>Notes</h2>" in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert '"label": "validation"' in page  # the loss chart: a line per series


def test_a_run_recorded_where_it_runs_reports_the_same_way(host, checkout):
    server, token = host
    done = checkout.run(server, token, "reports.py")
    assert done.returncode == 0, done.stdout + done.stderr
    task_id = recorded_id(done.stdout)
    task = server.wait_state(task_id, token=token)
    assert (task["state"], task["pool"]) == ("completed", "(local)"), task
    with server.api(token) as api:
        reports = api.get(f"/tasks/{task_id}/reports").json()
    assert sorted({r["kind"] for r in reports}) == KINDS, reports
    assert len(task["scalars"]) == 6
    found = checkout.run(
        server,
        token,
        "-c",
        "import klique; "
        "print(klique.Task.get_task(project_name='Reports', task_name='every kind').id)",
    )
    assert found.stdout.strip() == str(task_id), found.stdout + found.stderr  # the newest
