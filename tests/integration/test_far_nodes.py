"""Compute nodes that are not the server: a Slurm cluster whose one node is a far node of
scripts/netns-up (`far_slurm_cluster`), and a host pool whose `klique agent` runs on another far
node (`far_agent`). Each far node is a network namespace of its own (10.250.0.2, 10.250.0.3), as
another machine: this host's loopback is out of its jobs' reach. The server binds this host's
address on that network, 10.250.0.1, and tells its jobs that URL (server.public_url): a task
reports scalars and uploads artifacts there, a pipeline's controller and its steps run there,
JupyterLab opens through its route in a browser, and a server whose public URL is loopback
refuses such pools at start."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import (
    HTTP_TLS,
    ROOT,
    Server,
    free_port,
    stop_server,
    submitted_id,
    wait_for,
)
from conftest_services import SlurmCluster, private_cluster, run_script
from helpers.app import RUN_ONE_PLUS_ONE, chromium, launch, stop, wait_ready
from helpers.batch import JOB_PYTHON, batch_pool, open_folder, remove_tree, shared_folder
from helpers.estates import estate_yaml, profile
from helpers.sdk import Checkout, last_json, recorded_id, trusted_checkout

FAR_NODE = "klique-far1"  # the far cluster's node
FAR_HOST = "klique-far2"  # the host pool's host, where its agent runs
HOST = "10.250.0.1"  # this host, on the far nodes' network (scripts/netns-up)
# A private cluster of scripts/slurm-up whose node is the far node; its own folder and ports.
FAR_SLURM = {
    "KLIQUE_SLURM_DIR": "/tmp/klique-slurm-far",
    "KLIQUE_SLURM_CTLD_PORT": "7317",
    "KLIQUE_SLURM_SLURMD_PORT": "7318",
    "KLIQUE_SLURM_CLUSTER": "far",
    "KLIQUE_SLURM_NETNS": FAR_NODE,
}
# The first JupyterLab build installs it; later launches reuse the account's environment.
JUPYTER_READY_S = 300
# Connects to each HOST:PORT of its arguments and says whether it got there.
PROBE = """
import socket, sys
for where in sys.argv[1:]:
    host, port = where.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
        print(where, "reached", flush=True)
    except OSError as exc:
        print(where, "unreachable:", type(exc).__name__, flush=True)
"""


@dataclass
class FarSite:
    server: Server  # bound to HOST, its public URL http://HOST:PORT
    token: str  # alice's
    cluster: SlurmCluster
    folder: Path  # the server's own (its home, its estate)


@pytest.fixture(scope="module")
def far_slurm_cluster(test_users: tuple[str, str]) -> Iterator[SlurmCluster]:
    """The far cluster and its far node, made by scripts/slurm-up; both gone at the end."""
    try:
        yield from private_cluster(FAR_SLURM)
    finally:
        run_script("netns-down")


@pytest.fixture(scope="module")
def far_site(far_slurm_cluster: SlurmCluster) -> Iterator[FarSite]:
    """A server on HOST whose pool `batch` is the far cluster (cpu, 1-gpu and half-gpu there,
    pipeline controllers on cpu; uv staged in the job root for the tasks' environments), and
    whose host pool `box` is served by a remote agent (far-host; see `far_agent`)."""
    folder = shared_folder("klique-far-")
    job_root = open_folder(far_slurm_cluster.work / f"jobs-{folder.name}")
    host_root = open_folder(far_slurm_cluster.work / f"host-{folder.name}")
    server = None
    try:
        estate = folder / "estate.yaml"
        estate.write_text(far_estate(job_root, host_root))
        server = serve_on_far_network(folder / "home", estate, far_slurm_cluster.conf)
        yield FarSite(server, server.make_token("alice"), far_slurm_cluster, folder)
    finally:
        if server is not None:
            stop_server(server)
        remove_tree(job_root)
        remove_tree(host_root)
        remove_tree(folder)


def far_estate(job_root: Path, host_root: Path) -> str:
    """The far site's estate: the far cluster as pool `batch`, with the compute resources of
    tests/data/sdk's scripts, and the remote host pool `box` behind the resource far-host."""
    allocation = {"cpus": 1, "memory": "200M", "walltime": "10m"}
    host_pool = {
        "kind": "host",
        "agent": "remote",
        "slots": 2,
        "job_root": str(host_root),
        "user_map": {"alice": "alice", "bob": "bob"},
    }
    return estate_yaml(
        defaults={"pipeline_resource": "cpu"},
        resources={
            "cpu": profile("batch", **allocation),
            "1-gpu": profile("batch", gpus=1, **allocation),
            "half-gpu": profile("batch", gpu_fraction=0.5, **allocation),
            "far-host": profile("box", **allocation),
        },
        pools={"batch": batch_pool("slurm", job_root, None, uv="stage"), "box": host_pool},
    )


@pytest.fixture(scope="module")
def far_agent(far_site: FarSite) -> Iterator[None]:
    """`klique agent --pool box` on the far node FAR_HOST, as on another machine: the host
    pool's tasks run there, and the agent reaches the server at its public URL alone."""
    run_script("netns-up", FAR_HOST.removeprefix("klique-far"))
    server = far_site.server
    with server.api() as api:
        made = api.post("/agent-tokens", json={"pools": ["box"]})
    assert made.status_code == 201, made.text
    token_file = far_site.folder / "agent.token"
    token_file.write_text(made.json()["token"])
    token_file.chmod(0o600)
    argv = ["nsenter", f"--net=/run/netns/{FAR_HOST}", sys.executable, "-m", "broker", "agent"]
    argv += ["--pool", "box", "--server", server.url, "--token-file", str(token_file)]
    env = {**os.environ, "KLIQUE_HOME": str(far_site.folder / "agent-home")}
    log = far_site.folder / "agent.log"
    with log.open("wb") as out:
        agent = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd="/")
    try:

        def serving() -> bool:
            assert agent.poll() is None, log.read_text()
            pools = {p["name"]: p for p in json.loads(server.cli("pools", "--json").output)}
            return bool(pools["box"]["reachable"] and pools["box"]["last_good"])

        wait_for(serving, 60, f"the agent on {FAR_HOST} to report")
        yield
    finally:
        agent.terminate()
        agent.wait(30)


@pytest.fixture
def checkout() -> Iterator[Checkout]:
    with trusted_checkout() as made:
        yield made


def serve_on_far_network(home: Path, estate: Path, slurm_conf: Path) -> Server:
    """A server bound to HOST alone, with http://HOST:PORT as its public URL: nothing of it is
    on loopback. A port taken meanwhile by another process is tried again with another."""
    home.mkdir(parents=True, exist_ok=True)
    for _attempt in range(3):
        started = start_on_far_network(home, estate, slurm_conf)
        if started is not None:
            return started
    raise AssertionError(f"no free port on {HOST}: {(home / 'server.log').read_text()}")


def start_on_far_network(home: Path, estate: Path, slurm_conf: Path) -> Server | None:
    """One try of serve_on_far_network: the server once it answers as itself, or None when
    its port was taken before it bound it."""
    port, routes_port = port_on(HOST), port_on(HOST)
    url = f"http://{HOST}:{port}"
    argv = [sys.executable, "-m", "broker", "server", "--host", HOST, "--port", str(port)]
    argv += ["--routes-port", str(routes_port), "--public-url", url, "--estate", str(estate)]
    env = {**os.environ, "KLIQUE_HOME": str(home), "SLURM_CONF": str(slurm_conf)}
    log_file, token_file = home / "server.log", home / "admin.token"
    logged = log_file.stat().st_size if log_file.exists() else 0
    with log_file.open("ab") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def up() -> bool:
        if process.poll() is not None:
            return True
        if not token_file.exists():
            return False
        # Asked with this home's admin token: another server on the port does not know it.
        headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        try:
            answer = httpx.get(f"{url}/api/v1/whoami", headers=headers, timeout=1, verify=HTTP_TLS)
        except httpx.TransportError:
            return False
        return answer.status_code == 200

    wait_for(up, 60, f"the server to answer at {url}")
    if process.poll() is None:
        routes = f"http://{HOST}:{routes_port}"
        return Server(url, home, token_file.read_text().strip(), process, routes_url=routes)
    said = log_file.read_bytes()[logged:].decode(errors="replace")
    if "address already in use" in said.lower():
        return None
    raise AssertionError(f"server exited: {said}")


def port_on(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def ran_on(cluster: SlurmCluster, task: dict) -> str:
    """The node Slurm ran the task's job on, from Slurm's own record."""
    done = subprocess.run(
        ["squeue", "--noheader", "--states=all", f"--jobs={task['native_id']}", "--format=%N"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(cluster.conf)},
    )
    return done.stdout.strip()


def artifact(server: Server, token: str, task_id: int, name: str) -> bytes:
    with server.api(token) as api:
        answer = api.get(f"/tasks/{task_id}/artifacts/{name}")
    assert answer.status_code == 200, answer.text
    return answer.content


# Where each far compute resource runs: the far cluster's node, the remote host pool's host.
FAR_NODES = {"cpu": FAR_NODE, "far-host": FAR_HOST}
FAR_RESOURCES = list(FAR_NODES)


def far_node(site: FarSite, task: dict) -> str:
    """The far node the task ran on: Slurm's record of it, or the host where the host pool's
    one agent runs (its pool says so)."""
    if task["pool"] == "box":
        return FAR_HOST
    return ran_on(site.cluster, task)


@pytest.fixture
def far_resource(request: pytest.FixtureRequest) -> str:
    """A far compute resource; the host pool's agent is started for far-host."""
    if request.param == "far-host":
        request.getfixturevalue("far_agent")
    return str(request.param)


@pytest.mark.slurm
@pytest.mark.parametrize("far_resource", FAR_RESOURCES, indirect=True)
def test_a_task_on_a_far_node_reports_scalars_and_uploads_artifacts(
    far_site, far_resource, checkout
):
    server, token = far_site.server, far_site.token
    done = checkout.run(server, token, "track.py", "--remote", far_resource)
    assert done.returncode == 0, done.stdout + done.stderr
    task_id = recorded_id(done.stdout)
    task = server.wait_state(task_id, timeout=120, token=token)
    logs = server.cli("logs", str(task_id), token=token).output
    assert task["state"] == "completed", (task, logs)
    assert task["resource"] == far_resource
    assert far_node(far_site, task) == FAR_NODES[far_resource]
    assert f"running as alice in task {task_id}" in logs, logs
    assert [s["value"] for s in task["scalars"]] == [0.1, 0.05, 0.1 / 3]
    assert {a["name"] for a in task["artifacts"]} == {"weights", "summary"}
    assert artifact(server, token, task_id, "weights") == bytes(range(256)) * 4


@pytest.mark.slurm
def test_a_two_step_pipeline_runs_its_controller_and_steps_on_a_far_node(far_site, checkout):
    server, token = far_site.server, far_site.token
    done = checkout.run(server, token, "steps_more.py", "cached", "--remote")
    assert done.returncode == 0, done.stdout + done.stderr
    pipeline_id = last_json(done.stdout)["pipeline"]
    pipeline = server.wait_state(pipeline_id, timeout=300, token=token)
    logs = server.cli("logs", str(pipeline_id), token=token).output
    assert pipeline["state"] == "completed", (pipeline, logs)
    with server.api(token) as api:
        steps = api.get(f"/sdk/tasks/{pipeline_id}/steps").json()
    assert [(s["name"], s["state"]) for s in steps] == [
        ("square", "completed"),
        ("add", "completed"),
    ]
    for task in [pipeline, *(server.task(s["id"], token) for s in steps)]:
        assert task["pool"] == "batch" and ran_on(far_site.cluster, task) == FAR_NODE, task
    # add read square's output, uploaded by square's job, and its own went back the same way.
    assert pickle.loads(artifact(server, token, pipeline_id, "result")) == 10  # 3 * 3 + 1


@pytest.mark.slurm
@pytest.mark.parametrize("far_resource", FAR_RESOURCES, indirect=True)
def test_this_hosts_loopback_is_out_of_a_far_jobs_reach(far_site, far_resource):
    server, token = far_site.server, far_site.token
    public = urllib.parse.urlsplit(server.url).netloc
    with socket.create_server(("127.0.0.1", 0)) as listener:
        loopback = f"127.0.0.1:{listener.getsockname()[1]}"
        socket.create_connection(("127.0.0.1", listener.getsockname()[1]), timeout=5).close()
        command = ("submit", "--no-code", "--json", "-r", far_resource, "--")
        task_id = submitted_id(
            server.cli(*command, JOB_PYTHON, "-c", PROBE, loopback, public, token=token)
        )
        task = server.wait_state(task_id, timeout=120, token=token)
    logs = server.cli("logs", str(task_id), token=token).output
    assert task["state"] == "completed", (task, logs)
    assert far_node(far_site, task) == FAR_NODES[far_resource]
    # Reached from here a moment ago; refused there, where 127.0.0.1 is the far node's own.
    assert f"{loopback} unreachable: ConnectionRefusedError" in logs, logs
    assert f"{public} reached" in logs, logs


@pytest.mark.slurm
@pytest.mark.long
def test_jupyterlab_on_a_far_node_opens_through_its_route_in_a_real_browser(far_site):
    server, alice = far_site.server, far_site.token
    started = launch(server, alice, "jupyter", resource="cpu")
    task_id, route = started["id"], started["path"]
    # Ready when it answers through its route, whose tunnel the far node opened to the public URL.
    wait_ready(server, alice, task_id, JUPYTER_READY_S)
    assert ran_on(far_site.cluster, server.task(task_id, alice)) == FAR_NODE
    # Plain HTTP on an address other than loopback is no secure context, where JupyterLab's page
    # lacks crypto.randomUUID; a site serves it over TLS, the test names its origin instead.
    secure = f"--unsafely-treat-insecure-origin-as-secure={server.routes_url}"
    with chromium(secure) as browser:
        browser.get(route_code_url(server, alice, route.split("/")[2]))
        browser.get(f"{server.routes_url}{route}lab")
        assert browser.current_url == f"{server.routes_url}{route}lab"
        wait_for(
            lambda: browser.execute_script("return !!document.querySelector('.jp-Launcher')"),
            120,
            "JupyterLab's launcher to show",
            0.5,
        )
        assert browser.execute_async_script(RUN_ONE_PLUS_ONE, route) == "2"
    stopped = stop(server, alice, task_id)
    assert stopped["state"] == "cancelled", stopped


def route_code_url(server: Server, token: str, name: str) -> str:
    """A one-time address that opens the route in a browser (what `klique app open` prints)."""
    with server.api(token) as api:
        made = api.post(f"/routes/{name}/code")
    assert made.status_code == 201, made.text
    return str(made.json()["url"])


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_server_whose_public_url_is_its_loopback_or_any_address_refuses_a_far_pool(
    tmp_path, host
):
    estate = tmp_path / "estate.yaml"
    estate.write_text(far_estate(tmp_path / "jobs", tmp_path / "host"))
    port = free_port()
    argv = [sys.executable, "-m", "broker", "server", "--host", host, "--port", str(port)]
    argv += ["--routes-port", str(free_port()), "--estate", str(estate)]
    env = {**os.environ, "KLIQUE_HOME": str(tmp_path / "home")}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    said = (done.stdout + done.stderr).strip()
    assert done.returncode == 1, said
    # One sentence: which pool, the URL it cannot reach, and the setting that fixes it.
    assert said.startswith(
        f"klique: jobs of pool batch run on other nodes and cannot reach http://{host}:{port}; "
        "fix: set server.public_url in the estate (or --public-url) to a URL they reach"
    ), said
    assert "\n" not in said, said
