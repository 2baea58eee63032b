"""The Kubernetes emulator's API server as a client meets it (tests/fakes/_kubesim/), in process
and without Podman: its node holds nothing, so every pod stays Pending and no container runs.
What the answers must be is the real API server's wording, which Klique's driver parses."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes._kubesim import podman, volumes
from fakes._kubesim.api import make_app
from fakes._kubesim.faults import Faults
from fakes._kubesim.main import build, parser
from fakes._kubesim.store import Store

NS = "/api/v1/namespaces/team"
UNSCHEDULABLE = {"resources": {"requests": {"cpu": "1"}}}  # the node has no CPU: pods stay Pending


def pod(name: str, containers: tuple[str, ...] = ("task",), **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": c, "image": "localhost/none:1", **UNSCHEDULABLE} for c in containers
            ],
            **spec,
        },
    }


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Any]:
    """Call the emulator in process: `api(method, path, json=...)` -> httpx.Response."""
    argv = ["--port", "1", "--state", str(tmp_path), "--cpu", "0", "--memory", "0"]
    argv += [
        "--namespace",
        "team",
        "--namespace",
        "locked:pod-security.kubernetes.io/enforce=restricted",
    ]
    loop = asyncio.new_event_loop()
    cluster = loop.run_until_complete(_build(argv))
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=make_app(cluster)), base_url="http://k"
    )

    def call(method: str, path: str, **kwargs: Any) -> httpx.Response:
        return loop.run_until_complete(client.request(method, path, **kwargs))

    yield call
    loop.run_until_complete(client.aclose())
    loop.close()


async def _build(argv: list[str]) -> Any:
    return build(parser().parse_args(argv))


def test_a_pod_past_a_quota_is_forbidden_in_the_api_servers_words_until_one_leaves(api):
    quota = {"metadata": {"name": "one"}, "spec": {"hard": {"pods": "1"}}}
    assert api("POST", f"{NS}/resourcequotas", json=quota).status_code == 201
    assert api("POST", f"{NS}/pods", json=pod("a")).status_code == 201
    refused = api("POST", f"{NS}/pods", json=pod("b"))
    assert refused.status_code == 403
    assert refused.json()["reason"] == "Forbidden"
    assert refused.json()["message"] == (
        'pods "b" is forbidden: exceeded quota: one, '
        "requested: pods=1, used: pods=1, limited: pods=1"
    )
    assert api("GET", f"{NS}/resourcequotas/one").json()["status"]["used"] == {"pods": "1"}
    assert api("DELETE", f"{NS}/pods/a").status_code == 200
    assert api("POST", f"{NS}/pods", json=pod("b")).status_code == 201


def test_a_restricted_namespace_forbids_a_privileged_pod_naming_each_violation(api):
    privileged = pod("p", hostNetwork=True)
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    refused = api("POST", "/api/v1/namespaces/locked/pods", json=privileged)
    assert refused.status_code == 403
    message = refused.json()["message"]
    assert message.startswith('pods "p" is forbidden: violates PodSecurity "restricted:latest": ')
    assert "hostNetwork=true" in message and 'container "task"' in message
    assert api("POST", f"{NS}/pods", json=privileged).status_code == 201  # no level: admitted


def test_schema_errors_are_422_and_unknown_namespaces_404(api):
    bad = pod("x")
    bad["spec"]["containers"][0]["resources"] = {"limits": {"cpu": [1]}}
    invalid = api("POST", f"{NS}/pods", json=bad)
    assert invalid.status_code == 422
    assert invalid.json()["message"].startswith(
        'Pod "x" is invalid: spec.containers[0].resources.limits.cpu'
    )
    missing = api("POST", "/api/v1/namespaces/nowhere/pods", json=pod("y"))
    assert (missing.status_code, missing.json()["message"]) == (
        404,
        'namespaces "nowhere" not found',
    )


def test_injected_create_faults_answer_in_order_then_creates_go_through(api):
    faults = {"create": [{"status": 429, "times": 1}, {"status": 503, "times": 1}]}
    assert api("POST", "/emulator/faults", json=faults).status_code == 200
    first = api("POST", f"{NS}/pods", json=pod("a"))
    assert (first.status_code, first.headers["Retry-After"], first.json()["reason"]) == (
        429,
        "1",
        "TooManyRequests",
    )
    assert api("POST", f"{NS}/pods", json=pod("a")).status_code == 503
    assert api("POST", f"{NS}/pods", json=pod("a")).status_code == 201
    assert api("GET", "/emulator/faults").json() == {"create": [], "drop_after_create": 0}
    wrong = api("POST", "/emulator/faults", json={"create": [{"status": 404}]})
    assert wrong.status_code == 400 and "404" in wrong.json()["message"]


def test_a_log_without_a_container_on_a_pod_of_two_is_400_naming_them(api):
    assert api("POST", f"{NS}/pods", json=pod("two", ("sidecar", "task"))).status_code == 201
    answer = api("GET", f"{NS}/pods/two/log")
    assert answer.status_code == 400
    assert answer.json()["message"] == (
        "a container name must be specified for pod two, choose one of: [sidecar task]"
    )
    waiting = api("GET", f"{NS}/pods/two/log", params={"container": "task"})
    assert (
        waiting.json()["message"]
        == 'container "task" in pod "two" is waiting to start: ContainerCreating'
    )


def test_what_a_pod_owns_leaves_with_it(api):
    made = api("POST", f"{NS}/pods", json=pod("owner")).json()
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": made["metadata"]["uid"]}
    secret = {"metadata": {"name": "owned", "ownerReferences": [owner]}, "data": {"k": "dg=="}}
    assert api("POST", f"{NS}/secrets", json=secret).status_code == 201
    assert api("POST", f"{NS}/secrets", json={"metadata": {"name": "free"}}).status_code == 201
    assert api("DELETE", f"{NS}/pods/owner").status_code == 200
    names = [s["metadata"]["name"] for s in api("GET", f"{NS}/secrets").json()["items"]]
    assert names == ["free"]


def test_evicted_and_preempted_pods_get_disruption_target_with_the_reason(api):
    assert api("POST", f"{NS}/pods", json=pod("victim")).status_code == 201
    evicted = api("POST", f"{NS}/pods/victim/eviction", json={"metadata": {"name": "victim"}})
    assert (evicted.status_code, evicted.json()["status"]) == (201, "Success")
    # Unbound, it leaves at once; the watch saw the condition first.
    assert api("GET", f"{NS}/pods/victim").status_code == 404
    events = api(
        "GET", f"{NS}/pods", params={"watch": "1", "resourceVersion": "1", "timeoutSeconds": "0.1"}
    )
    modified = [line for line in events.text.splitlines() if '"MODIFIED"' in line]
    assert "EvictionByEvictionAPI" in modified[-1]
    assert api("POST", f"{NS}/pods", json=pod("lower")).status_code == 201
    assert api("POST", "/emulator/preempt/team/lower").status_code == 200
    events = api(
        "GET", f"{NS}/pods", params={"watch": "1", "resourceVersion": "1", "timeoutSeconds": "0.1"}
    )
    assert "PreemptionByScheduler" in [x for x in events.text.splitlines() if '"MODIFIED"' in x][-1]


def test_a_config_map_volume_is_swapped_atomically(tmp_path):
    volumes.write_atomically(tmp_path, {"a": b"1", "b": b"2"}, 0o644)
    first = os.readlink(tmp_path / "..data")
    assert (tmp_path / "a").read_bytes() == b"1" and os.readlink(tmp_path / "a") == "..data/a"
    volumes.write_atomically(tmp_path, {"a": b"3"}, 0o644)
    assert os.readlink(tmp_path / "..data") != first
    assert not (tmp_path / first).exists() and not (tmp_path / "b").exists()
    assert (tmp_path / "a").read_bytes() == b"3"


def test_a_containers_security_context_becomes_podmans_options():
    spec = pod("s", securityContext={"runAsUser": 1001, "runAsGroup": 1001, "fsGroup": 7})
    spec["spec"]["containers"][0].update(
        securityContext={
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        resources={"limits": {"memory": "64Mi", "cpu": "500m"}},
    )
    argv = podman.run_argv("podman", "n", "s", "l", spec, spec["spec"]["containers"][0], [], {})
    for option in (
        "--user=1001:1001",
        "--group-add=7",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        "--read-only",
        f"--memory={64 << 20}b",
        "--cpus=0.5",
        "--network=host",
        "--pull=never",
    ):
        assert option in argv


def test_faults_parse_refuses_what_it_cannot_inject():
    with pytest.raises(ValueError, match="status 200"):
        Faults.parse({"create": [{"status": 200}]})


def test_a_missing_secret_is_the_kubelets_mount_failure_and_the_downward_api_names_the_pod(
    tmp_path,
):
    store = Store(10)
    spec = pod("web", volumes=[{"name": "token", "secret": {"secretName": "later"}}])
    spec["metadata"].update(namespace="team", uid="u-1", labels={"app": "x"})
    with pytest.raises(volumes.MountFailed) as failed:
        volumes.set_up(store, "team", spec, tmp_path)
    assert str(failed.value) == (
        'MountVolume.SetUp failed for volume "token" : secret "later" not found'
    )
    items = [
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
    ]
    spec["spec"]["volumes"] = [{"name": "info", "downwardAPI": {"items": items}}]
    folder = volumes.set_up(store, "team", spec, tmp_path)["info"]
    assert (folder / "name").read_text() == "web"
    assert (folder / "labels").read_text() == 'app="x"\n'
