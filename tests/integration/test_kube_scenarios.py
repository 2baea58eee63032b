"""A Kubernetes pool as a cluster treats it, end to end: the server's driver against the emulator
of tests/fakes/_kubesim/ (one per module), whose kubelet runs each pod in Podman, in a namespace
that enforces Pod Security "restricted". Tasks wait on a gate file in their pod's job folder
(an emptyDir the test reaches on the node), so nothing races the kubelet."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Server, start_server, stop_server, wait_for
from helpers.estates import estate_yaml, profile
from helpers.kube import IMAGE, RESTRICTED, Emulator, kube_pool

pytestmark = pytest.mark.podman

GRACE = 2  # the site template's terminationGracePeriodSeconds
TERMINAL = ("Succeeded", "Failed")
# A compute resource's overrides (templates_dir/kubernetes/<resource>.yaml): a sidecar as sites
# add one, a second container (so the API wants a container named to give a log).
SIDECAR = {
    "spec": {
        "containers": [
            {
                "name": "sidecar",
                "image": IMAGE,
                "command": ["sh", "-c", 'trap "exit 0" TERM; echo sidecar up; '
                            "while true; do sleep 0.2; done"],
            }
        ]
    }
}  # fmt: skip
# A base template a site might write: what Pod Security "restricted" refuses.
PRIVILEGED = {
    "apiVersion": "v1",
    "kind": "Pod",
    "spec": {
        "hostNetwork": True,
        "containers": [{"name": "task", "securityContext": {"privileged": True}}],
    },
}
# Waits for `gate` in its job folder (the test touches it on the node).
GATE = (
    "import os, time\n"
    "while not os.path.exists(os.environ['KLIQUE_JOB_DIR'] + '/gate'):\n"
    "    time.sleep(0.1)\n"
)
# Scalars through the runner's in-job SDK (inside_job.report, on the task's PYTHONPATH).
SCALARS = (
    "from inside_job import report\n"
    "for i in range(3):\n"
    "    report.scalar('loss', 1.0 / (i + 1), step=i)\n"
    "print('trained')"
)


def estate(url: str, templates: Path, **pool_extra: Any) -> str:
    allocation = {"cpus": 1, "memory": "400M", "walltime": "1h"}
    pool = kube_pool(url, delete_grace=f"{GRACE}s", lost_after="3s", **pool_extra)
    resources = {
        "cpu": profile("k8s", **allocation),
        "with-sidecar": profile("k8s", **allocation),
    }
    return estate_yaml(templates_dir=str(templates), resources=resources, pools={"k8s": pool})


@pytest.fixture(scope="module")
def cluster(podman) -> Iterator[Emulator]:
    emulator = Emulator(labels=RESTRICTED, toleration=1, backoff_scale=0.1)
    yield emulator
    emulator.stop()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("kube-scenarios")
    kube = folder / "templates" / "kubernetes"
    kube.mkdir(parents=True)
    base = {"apiVersion": "v1", "kind": "Pod", "spec": {"terminationGracePeriodSeconds": GRACE}}
    (kube / "pod.yaml").write_text(json.dumps(base))
    (kube / "with-sidecar.yaml").write_text(json.dumps(SIDECAR))
    (kube / "privileged.yaml").write_text(json.dumps(PRIVILEGED))
    return folder


@pytest.fixture(scope="module")
def server(cluster: Emulator, home: Path) -> Iterator[Server]:
    path = home / "estate.yaml"
    path.write_text(estate(cluster.url, home / "templates"))
    started = start_server(home, path)
    yield started
    stop_server(started)


def submit(server: Server, code: str, resource: str = "cpu") -> int:
    body = {"command": ["python3", "-c", code], "resource": resource}
    with server.api() as api:
        answer = api.post("/tasks", json=body)
    assert answer.status_code in (200, 201), answer.text
    return int(answer.json()["id"])


def running_pod(
    server: Server, cluster: Emulator, task_id: int, attempt: int = 1
) -> dict[str, Any]:
    """The attempt's pod once its task runs (the runner reported from inside it)."""
    name = f"klique-{task_id}-{attempt}"

    def found() -> dict[str, Any] | None:
        task = server.task(task_id)
        pods = [p for p in cluster.pods(task_id) if p["metadata"]["name"] == name]
        return (
            pods[0] if pods and task["state"] == "running" and task["native_id"] == name else None
        )

    return wait_for(found, 60, f"task {task_id} to run in pod {name}")


def open_gate(cluster: Emulator, pod: dict[str, Any]) -> None:
    (cluster.job_folder(pod) / "gate").touch()


def history(server: Server, task_id: int) -> list[str]:
    return [event["to"] for event in server.task(task_id)["events"]]


def lost(server: Server, task_id: int) -> list[dict[str, Any]]:
    """The task's moves back to the queue after an attempt was lost."""
    events = server.task(task_id)["events"]
    return [e for e in events if e["to"] == "queued" and e["reason"].startswith("lost: ")]


def test_a_task_in_a_restricted_namespace_completes_and_reports_its_scalars(server, cluster):
    task_id = submit(server, SCALARS)
    done = server.wait_state(task_id)
    assert (done["state"], done["exit_code"]) == ("completed", 0), done
    assert [(s["name"], s["step"]) for s in done["scalars"]] == [
        ("loss", 0),
        ("loss", 1),
        ("loss", 2),
    ]
    assert "trained" in server.cli("logs", str(task_id)).output
    wait_for(lambda: not cluster.pods(task_id), 30, "the finished task's pod to be deleted")
    assert not [
        s
        for s in cluster.items("secrets")
        if s["metadata"]["name"].startswith(f"klique-{task_id}-")
    ]


def test_a_sidecar_from_a_site_template_keeps_both_containers_logs(server, cluster, home):
    task_id = submit(server, GATE + "print('task output')", resource="with-sidecar")
    pod = running_pod(server, cluster, task_id)
    name = pod["metadata"]["name"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["sidecar", "task"]
    unnamed = httpx.get(cluster.api(f"pods/{name}/log"))
    assert unnamed.status_code == 400
    assert "a container name must be specified for pod" in unnamed.json()["message"]

    def sidecar_log() -> str:
        return httpx.get(cluster.api(f"pods/{name}/log"), params={"container": "sidecar"}).text

    wait_for(lambda: "sidecar up" in sidecar_log(), 30, "the sidecar's own log")
    open_gate(cluster, pod)
    done = server.wait_state(task_id)
    assert (done["state"], done["exit_code"]) == ("completed", 0), done
    assert "task output" in server.cli("logs", str(task_id)).output
    wait_for(lambda: not cluster.pods(task_id), 30, "the finished task's pod to be deleted")
    # The runner's own output, asked for by its container's name: not the API's 400.
    saved = (home / "pod-logs" / "k8s" / f"{name}.log").read_text()
    assert "no log" not in saved and "sidecar up" not in saved, saved


def test_a_quota_refusal_waits_then_runs_when_the_quota_frees(server, cluster):
    live = [p for p in cluster.items("pods") if p["status"].get("phase") not in TERMINAL]
    hard = {"pods": str(len(live) + 1)}  # room for one more pod than this moment's
    quota = {"metadata": {"name": "one-more"}, "spec": {"hard": hard}}
    assert httpx.post(cluster.api("resourcequotas"), json=quota).status_code == 201
    try:
        first = submit(server, GATE)
        pod = running_pod(server, cluster, first)
        second = submit(server, "print('second')")
        wait_for(
            lambda: "exceeded quota" in server.task(second)["reason"],
            60,
            "the quota's 403 as the reason",
        )
        assert "exceeded quota: one-more" in server.cli("why", str(second)).output
        assert not cluster.pods(second)
        open_gate(cluster, pod)
        assert server.wait_state(first)["state"] == "completed"
        done = server.wait_state(second, timeout=90)
        assert (done["state"], done["exit_code"]) == ("completed", 0), done
    finally:
        httpx.delete(cluster.api("resourcequotas/one-more"))


def test_an_evicted_pod_requeues_its_task(server, cluster):
    task_id = submit(server, GATE + "print('ran to the end')")
    pod = running_pod(server, cluster, task_id)
    name = pod["metadata"]["name"]
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    assert httpx.post(cluster.api(f"pods/{name}/eviction"), json=eviction).status_code == 201
    again = running_pod(server, cluster, task_id, attempt=2)
    open_gate(cluster, again)
    done = server.wait_state(task_id)
    assert (done["state"], done["exit_code"]) == ("completed", 0), done
    assert "queued" in history(server, task_id)[4:], done["events"]


def test_an_outage_during_create_makes_no_duplicate_pod(server, cluster):
    cluster.emulator("faults", {"create": [{"status": 503, "times": 1}], "drop_after_create": 1})
    task_id = submit(server, "print('once')")
    done = server.wait_state(task_id, timeout=90)
    assert (done["state"], done["exit_code"]) == ("completed", 0), done
    assert done["native_id"] == f"klique-{task_id}-1"
    created = [
        e for e in cluster.pod_events() if e["labels"].get("klique.dev/task") == str(task_id)
    ]
    assert [e["name"] for e in created] == [f"klique-{task_id}-1"]
    assert cluster.emulator_get("faults") == {"create": [], "drop_after_create": 0}


def test_a_restricted_namespace_refuses_a_privileged_pod(cluster):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged"},
        "spec": {
            **PRIVILEGED["spec"],
            "containers": [
                {"name": "task", "image": IMAGE, "securityContext": {"privileged": True}}
            ],
        },
    }
    answer = httpx.post(cluster.pods_url(), json=pod)
    assert answer.status_code == 403
    message = answer.json()["message"]
    assert message.startswith(
        'pods "privileged" is forbidden: violates PodSecurity "restricted:latest": '
    )
    assert "host namespaces (hostNetwork=true)" in message
    assert 'privileged (container "task" must not set securityContext.privileged=true)' in message


def test_estate_check_refuses_a_privileged_site_template(cluster, home, server):
    path = home / "privileged-estate.yaml"
    path.write_text(estate(cluster.url, home / "templates", pod_template="privileged"))
    checked = server.cli("estate", "check", str(path))
    assert checked.exit_code != 0, checked.output
    assert "hostNetwork" in checked.output and "allow_privileged_templates" in checked.output


def test_a_lost_node_ends_the_attempt_lost_and_requeues_it(server, cluster):
    task_id = submit(server, GATE + "print('after the node came back')")
    pod = running_pod(server, cluster, task_id)
    cluster.node_ready(False)
    try:
        wait_for(lambda: lost(server, task_id), 60, "the attempt to end LOST and be requeued")
        [old] = [
            p for p in cluster.pods(task_id) if p["metadata"]["name"] == pod["metadata"]["name"]
        ]
        assert old["metadata"].get("deletionTimestamp")  # Terminating while its node is down
        reasons = {c["type"]: c.get("reason") for c in old["status"]["conditions"]}
        assert reasons["DisruptionTarget"] == "DeletionByTaintManager"
    finally:
        cluster.node_ready(True)
    again = running_pod(server, cluster, task_id, attempt=2)
    open_gate(cluster, again)
    done = server.wait_state(task_id)
    assert (done["state"], done["exit_code"]) == ("completed", 0), done
    wait_for(lambda: not cluster.pods(task_id), 30, "both attempts' pods to be gone")
