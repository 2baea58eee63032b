"""Pods of Kubernetes pools: the template merge rules, the GPU forms, labels, names, the
deadline and the runner's delivery; every pod of the test estate validated against the
Kubernetes 1.33 schema in strict mode (kubernetes-validate)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path

import kubernetes_validate
import pytest

from broker.domain import Task, TaskSpec, TaskState
from broker.errors import TemplateError
from broker.estate import load_estate
from broker.pools import kube_pod
from broker.pools.base import Context
from broker.pools.kube_states import observe
from broker.pools.kubernetes import KubernetesDriver, pod_name

DATA = Path(__file__).resolve().parent.parent / "data" / "kubernetes"
KUBERNETES_VERSION = "1.33"


def estate():
    loaded = load_estate(DATA / "estate.yaml")
    return replace(loaded, templates_dir=str(DATA / "templates"))


def driver(tmp_path: Path, pool: str = "k8s-onprem", site: bool = True) -> KubernetesDriver:
    e = estate() if site else replace(estate(), templates_dir=None)
    runner = tmp_path / "klique-runner.pyz"
    runner.write_bytes(b"PK")
    return KubernetesDriver(e.pools[pool], Context(e, tmp_path, runner, "http://klique:8000"))


def task(resource: str, task_id: int = 42, attempts: int = 1, **spec: object) -> Task:
    return Task(
        id=task_id,
        spec=TaskSpec(command=("python", "train.py"), resource=resource, **spec),  # type: ignore[arg-type]
        owner="alice",
        team=None,
        state=TaskState.PLACED,
        attempts=attempts,
    )


def runner_container(pod: dict) -> dict:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "task")


# The merge rules.


def test_mappings_merge_key_by_key_and_null_removes():
    base = {"a": {"x": 1, "y": 2}, "b": 1}
    assert kube_pod.merge(base, {"a": {"y": 3, "z": 4}, "b": None}) == {
        "a": {"x": 1, "y": 3, "z": 4}
    }
    assert base == {"a": {"x": 1, "y": 2}, "b": 1}  # inputs are not changed


def test_containers_env_and_volumes_merge_by_name():
    base = {
        "containers": [
            {"name": "task", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "1"}]},
            {"name": "side", "image": "s:1"},
        ],
        "volumes": [{"name": "data", "emptyDir": {}}],
    }
    override = {
        "containers": [
            {"name": "task", "env": [{"name": "B", "value": "2"}, {"name": "C", "value": "3"}]}
        ],
        "volumes": [
            {"name": "data", "emptyDir": {"medium": "Memory"}},
            {"name": "more", "emptyDir": {}},
        ],
    }
    merged = kube_pod.merge(base, override)
    assert merged["containers"][0]["env"] == [
        {"name": "A", "value": "1"},
        {"name": "B", "value": "2"},
        {"name": "C", "value": "3"},
    ]
    assert merged["containers"][1] == {"name": "side", "image": "s:1"}
    assert merged["volumes"] == [
        {"name": "data", "emptyDir": {"medium": "Memory"}},
        {"name": "more", "emptyDir": {}},
    ]


def test_tolerations_are_appended_once_and_other_lists_replaced():
    t1 = {"key": "a", "operator": "Exists"}
    t2 = {"key": "b", "operator": "Exists"}
    merged = kube_pod.merge(
        {"tolerations": [t1], "args": ["x", "y"]}, {"tolerations": [t1, t2], "args": ["z"]}
    )
    assert merged == {"tolerations": [t1, t2], "args": ["z"]}


# Pods as Klique renders them.


@pytest.mark.parametrize("pool", ["k8s-onprem", "k8s-mig"])
def test_every_pod_of_the_test_estate_is_valid_kubernetes(tmp_path, pool):
    d = driver(tmp_path, pool)
    resources = [r for r, c in d.context.estate.resources.items() if pool in c.profile.pools]
    assert resources
    for resource in resources:
        for site in (True, False):
            pod = driver(tmp_path, pool, site).render(task(resource))
            kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


def test_gpu_forms_are_different_limits(tmp_path):
    def limits(resource: str, pool: str = "k8s-onprem") -> dict:
        return runner_container(driver(tmp_path, pool).render(task(resource)))["resources"][
            "limits"
        ]

    assert limits("cpu") == {"cpu": "2", "memory": "2048Mi"}  # no GPU at all
    assert limits("1-gpu")["nvidia.com/gpu"] == "1"
    assert limits("4-gpu")["nvidia.com/gpu"] == "4"
    assert limits("half-gpu") == {"cpu": "2", "memory": "8192Mi", "nvidia.com/gpu.shared": "1"}
    assert limits("gpu-10g", "k8s-mig") == {
        "cpu": "2",
        "memory": "8192Mi",
        "nvidia.com/mig-1g.10gb": "1",
    }


def test_a_memory_capped_share_is_enforced_by_the_runner(tmp_path):
    d = driver(tmp_path)
    pod = d.render(task("half-gpu"))
    env = {e["name"]: e["value"] for e in runner_container(pod)["env"]}
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"  # half of 40G
    document = d.task_document(task("half-gpu"), "token")
    assert document["gpu_memory_limit_mb"] == 20480
    assert "gpu_memory_limit_mb" not in d.task_document(task("1-gpu"), "token")


def test_labels_name_deadline_and_runner_delivery(tmp_path):
    d = driver(tmp_path)
    t = task("1-gpu", task_id=7, attempts=2)
    t = replace(t, job_dir=d.new_job_dir(t))
    pod = d.render(t)
    assert pod["metadata"]["name"] == "klique-7-2" == pod_name(t)
    assert pod["metadata"]["labels"] == {
        "team-cost-centre": "research",  # the site's base template
        "klique.dev/task": "7",
        "klique.dev/attempt": "2",
        "klique.dev/pool": "k8s-onprem",
        "klique.dev/installation": "test-site",
    }
    assert pod["spec"]["activeDeadlineSeconds"] == 4 * 3600
    assert pod["spec"]["restartPolicy"] == "Never"
    container = runner_container(pod)
    assert container["command"] == [
        "python3",
        "/opt/klique/klique-runner.pyz",
        "/klique/job/klique-7-2",
    ]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["klique-runner"]["configMap"]["name"].startswith("klique-runner")
    assert volumes["klique-task"]["secret"]["secretName"] == "klique-7-2-task"
    assert "datasets" in volumes and "dshm" in volumes  # base, then the resource's overrides
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SITE"] == "gpu" and env["HTTPS_PROXY"].startswith("http://proxy")
    keys = [t["key"] for t in pod["spec"]["tolerations"]]
    assert keys == ["dedicated", "nvidia.com/gpu"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["task", "log-shipper"]


def test_the_built_in_template_is_used_without_a_site_folder(tmp_path):
    pod = driver(tmp_path, site=False).render(task("cpu"))
    assert pod["metadata"]["annotations"] == {"klique.dev/template": "built-in"}
    assert runner_container(pod)["image"] == "python:3.12-slim"


def test_the_task_travels_in_a_secret_never_in_the_pod(tmp_path):
    d = driver(tmp_path)
    hostile = "x'; rm -rf / #\n$(id)"
    t = task("cpu", name=hostile, env={"EVIL": hostile})
    pod = json.dumps(d.render(t))
    assert "rm -rf" not in pod and "EVIL" not in pod
    document = d.task_document(t, "tok")
    assert document["env"] == {"EVIL": hostile} and document["image"] is None
    assert base64.b64encode(json.dumps(document).encode())  # what submit puts in the Secret


def test_a_task_image_is_checked(tmp_path):
    d = driver(tmp_path)
    ok = d.render(task("cpu", image="docker://ghcr.io/example/train:1.0"))
    assert runner_container(ok)["image"] == "ghcr.io/example/train:1.0"
    with pytest.raises(TemplateError):
        d.render(task("cpu", image="ubuntu; curl evil"))


def test_a_broken_site_template_names_its_file(tmp_path):
    folder = tmp_path / "site" / "kubernetes"
    folder.mkdir(parents=True)
    (folder / "pod.yaml").write_text("- just\n- a list\n")
    d = driver(tmp_path)
    d.context = replace(
        d.context, estate=replace(d.context.estate, templates_dir=str(tmp_path / "site"))
    )
    with pytest.raises(TemplateError, match="pod.yaml"):
        d.render(task("cpu"))


# The pod table.


def _pod(phase: str, **status: object) -> dict:
    return {
        "metadata": {"name": "p"},
        "spec": {"activeDeadlineSeconds": 60},
        "status": {"phase": phase, **status},
    }


def _terminated(code: int, reason: str = "", message: str = "") -> list[dict]:
    state = {"terminated": {"exitCode": code, "reason": reason, "message": message}}
    return [{"name": "task", "state": state}]


def test_pod_phases_and_container_states_map_to_task_states():
    assert observe(_pod("Running")).state is TaskState.RUNNING  # type: ignore[union-attr]
    assert observe(_pod("Unknown")) is None
    done = observe(_pod("Succeeded", containerStatuses=_terminated(0, "Completed")))
    assert done is not None and done.state is TaskState.COMPLETED and done.exit_code == 0
    failed = observe(_pod("Failed", containerStatuses=_terminated(3, "Error")))
    assert failed is not None and (failed.state, failed.reason) == (TaskState.FAILED, "exit code 3")
    oom = observe(_pod("Failed", containerStatuses=_terminated(137, "OOMKilled")))
    assert oom is not None and oom.reason.startswith("OOMKilled")
    late = observe(_pod("Failed", reason="DeadlineExceeded"))
    assert late is not None and late.state is TaskState.TIMEOUT


def test_a_claim_of_success_from_a_failed_container_is_not_believed():
    claim = json.dumps({"outcome": "completed", "exit_code": 0})
    seen = observe(_pod("Failed", containerStatuses=_terminated(1, "Error", claim)))
    assert seen is not None and seen.state is TaskState.FAILED
    told = json.dumps({"outcome": "setup_failed", "exit_code": 125, "reason": "pip failed"})
    seen = observe(_pod("Failed", containerStatuses=_terminated(125, "Error", told)))
    assert seen is not None and seen.reason == "pip failed" and seen.exit_code == 125


@pytest.mark.parametrize("reason", ["InvalidImageName", "CreateContainerConfigError"])
def test_a_container_that_cannot_start_fails_the_task_with_its_reason(reason):
    waiting = [{"name": "task", "state": {"waiting": {"reason": reason, "message": "not found"}}}]
    seen = observe(_pod("Pending", containerStatuses=waiting))
    assert seen is not None and seen.state is TaskState.FAILED
    assert seen.reason.startswith(reason) and seen.reason.endswith("not found")


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "ErrImagePull"])
def test_an_image_pull_the_kubelet_retries_keeps_the_task_waiting(reason):
    waiting = [{"name": "task", "state": {"waiting": {"reason": reason, "message": "not found"}}}]
    seen = observe(_pod("Pending", containerStatuses=waiting))
    assert seen is not None and seen.state is TaskState.PENDING
    assert seen.reason.startswith(reason) and "tries again" in seen.reason


def test_an_unschedulable_pod_says_why():
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
    }
    seen = observe(_pod("Pending", conditions=[condition]))
    assert seen is not None and seen.state is TaskState.PENDING
    assert seen.reason == f"Unschedulable: {message}"


def test_the_shipped_role_is_valid_and_namespaced():
    import yaml

    path = Path(kube_pod.__file__).resolve().parent.parent / "deploy" / "kubernetes-rbac.yaml"
    documents = list(yaml.safe_load_all(path.read_text()))
    assert [d["kind"] for d in documents] == ["ServiceAccount", "Role", "RoleBinding"]
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in documents[1]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    # Exactly the calls of broker/pools/kube_api.py; Kueue's two only where a Role has them.
    used = {
        ("", "pods"): {"create", "get", "list", "watch", "delete"},
        ("", "pods/log"): {"get"},
        ("", "secrets"): {"create", "delete"},
        ("", "configmaps"): {"create", "get"},
    }
    kueue = {
        ("batch", "jobs"): {"create", "get", "delete"},
        ("kueue.x-k8s.io", "workloads"): {"list"},
    }
    assert {k: v for k, v in granted.items() if k not in kueue} == used
    assert all(granted[k] == kueue[k] for k in kueue if k in granted)
