"""JupyterLab as a session, on the host pool and on the real Slurm pool, opened through its
route by Debian's headless Chromium: the page loads, a kernel runs 1+1 over the route's
WebSocket, another user's token is refused, and stopping it frees the compute resource while
the ledger keeps its runtime. JupyterLab is installed for the task's account by the runner's
own environment building (uv, cached: the second pool reuses the first one's environment)."""

from __future__ import annotations

import json
import subprocess
import uuid

import httpx
import pytest
import websockets.sync.client
from conftest import HOST_ACCESS, wait_for
from helpers.app import RUN_ONE_PLUS_ONE, chromium, launch, stop, wait_ready
from helpers.batch import open_folder, pool_yaml, remove_tree
from websockets.exceptions import InvalidStatus

TEAMS = "teams:\n  vision: [alice]\n  nlp: [bob]\n"
RESOURCE = "resources:\n  cpu:\n    profile: {cpus: 1, memory: 2G, walltime: 20m, pools: [p]}\n"
# The first build downloads JupyterLab; later launches reuse the account's environment.
READY_S = 300


@pytest.fixture(params=["host", pytest.param("slurm", marks=pytest.mark.slurm)])
def session_server(request, server_factory):
    if request.param == "host":
        estate = (
            TEAMS + RESOURCE + f"pools:\n  p:\n    kind: host\n    slots: 2\n    {HOST_ACCESS}\n"
        )
        yield request.param, server_factory(estate)
        return
    cluster = request.getfixturevalue("slurm_cluster")
    job_root = open_folder(cluster.work / f"apps-{uuid.uuid4().hex[:8]}")
    pool = pool_yaml("slurm", job_root, None, uv="stage").replace("  batch:", "  p:")
    yield request.param, server_factory(TEAMS + RESOURCE + "pools:\n" + pool)
    remove_tree(job_root)


def test_jupyterlab_runs_through_its_route_in_a_real_browser(session_server):
    pool, server = session_server
    alice, bob = server.make_token("alice"), server.make_token("bob")
    started = launch(server, alice, "jupyter", resource="cpu")
    task_id, route = started["id"], started["path"]
    assert started["kind"] == "session" and route.startswith("/routes/jupyter-")
    wait_ready(server, alice, task_id, READY_S)

    name = route.split("/")[2]
    with chromium() as browser:
        browser.get(_code_url(server, alice, name))  # as `klique app open` prints it
        assert "code=" not in browser.current_url  # the code left the address
        browser.get(f"{server.routes_url}{route}lab")
        assert browser.current_url == f"{server.routes_url}{route}lab"
        wait_for(
            lambda: browser.execute_script("return !!document.querySelector('.jp-Launcher')"),
            120,
            "JupyterLab's launcher to show",
            0.5,
        )
        assert "JupyterLab" in browser.title
        assert browser.execute_async_script(RUN_ONE_PLUS_ONE, route) == "2"

    with httpx.Client(base_url=server.routes_url, timeout=30) as http:
        theirs = http.get(f"{route}lab", headers={"Authorization": f"Bearer {bob}"})
        nobody = http.get(f"{route}lab")
        cookie = http.get(f"{route}api/kernels", headers={"Cookie": f"klique_route={bob}"})
        http.get(_code_url(server, alice, name))  # alice's route session, in the cookie jar
        session = http.cookies["klique_route"]
    assert theirs.status_code == 403 and "not open to bob" in theirs.json()["detail"]
    assert nobody.status_code == 401 and cookie.status_code == 401  # a token is no session
    # JupyterLab's event stream, with alice's cookie: from the route's own pages, not another site.
    events = server.routes_url.replace("http://", "ws://") + f"{route}api/events/subscribe"
    own = {"Cookie": f"klique_route={session}"}
    with websockets.sync.client.connect(events, additional_headers=own, origin=server.routes_url):
        pass
    with pytest.raises(InvalidStatus) as refused:
        websockets.sync.client.connect(events, additional_headers=own, origin="http://evil.example")
    assert refused.value.response.status_code == 403

    stopped = stop(server, alice, task_id)
    assert stopped["state"] == "cancelled", stopped
    task = server.task(task_id, alice)
    if pool == "host":
        wait_for(
            lambda: json.loads(server.cli("pools", "--json").output)[0]["free_slots"] == 2,
            30,
            "the slot to be free again",
        )
    else:
        wait_for(lambda: _left_the_queue(task["native_id"]), 60, "the job to leave Slurm")
    usage = json.loads(server.cli("usage", "--by", "user", "--json", token=alice).output)
    (row,) = usage["rows"]
    assert row["key"] == "alice" and row["runs"] == 1 and row["ongoing"] == 0
    assert row["wall_seconds"] >= task["finished_at"] - task["started_at"] - 1 > 0


def _left_the_queue(native_id: str) -> bool:
    out = subprocess.run(
        ["squeue", "--noheader", "--states=all", f"--jobs={native_id}", "--format=%T"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return out in ("", "CANCELLED", "COMPLETED")


def _code_url(server, token: str, name: str) -> str:
    """A one-time address that opens the route in a browser (what `klique app open` prints)."""
    with server.api(token) as api:
        made = api.post(f"/routes/{name}/code")
    assert made.status_code == 201, made.text
    return str(made.json()["url"])
