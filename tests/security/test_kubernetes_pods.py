"""A task cannot shape its pod: nothing its owner controls (name, command, env, project,
parameters, image) reaches the pod spec except a checked image reference; the fields that
decide what a pod may do on its node (privileged, privilege escalation, the user, hostPath,
the service account and its token) are Klique's, set after every template; the report token
travels in the task's Secret only; a task cannot lift its GPU memory cap."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from fakes._kubesim.pod_security import violations

from broker.domain import Task, TaskSpec, TaskState
from broker.errors import EstateError, TemplateError
from broker.estate import parse_estate
from broker.pools import kube_pod
from broker.pools.base import Context
from broker.pools.kubernetes import KubernetesDriver

HOSTILE = "x\n  privileged: true\nhostPath: {path: /}\nserviceAccountName: admin $(id) `id`"
ESTATE = """
resources:
  cpu:
    profile: {cpus: 1, memory: 1G, walltime: 1h, pools: [k8s]}
  share:
    profile: {gpu_fraction: 0.25, cpus: 1, memory: 1G, walltime: 1h, pools: [k8s]}
  gpus:
    profile: {gpus: 2, cpus: 1, memory: 1G, walltime: 1h, pools: [k8s]}
pools:
  k8s:
    kind: kubernetes
    namespace: klique
    server: http://127.0.0.1:1
    installation: site
    shared_gpu_resource: nvidia.com/gpu.shared
    gpu_memory: 40G
"""


def make_driver(tmp_path: Path, templates: Path | None = None) -> KubernetesDriver:
    estate = parse_estate(ESTATE)
    if templates is not None:
        estate = replace(estate, templates_dir=str(templates))
    runner = tmp_path / "runner.pyz"
    runner.write_bytes(b"PK")
    return KubernetesDriver(estate.pools["k8s"], Context(estate, tmp_path, runner, "http://k:1"))


def hostile_task(resource: str = "cpu", **spec: object) -> Task:
    fields: dict[str, object] = {
        "command": ("sh", "-c", HOSTILE),
        "resource": resource,
        "name": HOSTILE.replace("\n", " "),
        "project": "p",
        "env": {"KUBE_PRIVILEGED": HOSTILE, "serviceAccountName": "admin"},
        **spec,
    }
    return Task(
        id=5,
        spec=TaskSpec(**fields),  # type: ignore[arg-type]
        owner="alice",
        team=None,
        state=TaskState.PLACED,
        attempts=1,
        parameters={"hostPath": "/"},
    )


def locked_down(pod: dict) -> None:
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec and "serviceAccount" not in spec
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert all("hostPath" not in v for v in spec["volumes"])
    task = next(c for c in spec["containers"] if c["name"] == "task")
    assert task["securityContext"]["privileged"] is False
    assert task["securityContext"]["allowPrivilegeEscalation"] is False
    assert task["securityContext"]["runAsUser"] != 0


def test_nothing_a_task_controls_enters_its_pod(tmp_path):
    driver = make_driver(tmp_path)
    pod = driver.render(hostile_task())
    text = json.dumps(pod)
    for piece in ("privileged: true", "hostPath: {", "$(id)", "KUBE_PRIVILEGED", "admin"):
        assert piece not in text
    locked_down(pod)
    document = driver.task_document(hostile_task(), "report-token")
    assert document["env"]["KUBE_PRIVILEGED"] == HOSTILE  # it travels in the Secret
    assert "report-token" not in text


@pytest.mark.parametrize(
    "image",
    ["ubuntu\nprivileged: true", "img:1 --privileged", "$(id)", "img`id`", "-v /:/host"],
)
def test_an_image_reference_cannot_carry_anything_else(tmp_path, image):
    with pytest.raises(TemplateError):
        make_driver(tmp_path).render(hostile_task(image=image))


def _site(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "site" / "kubernetes"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pod.yaml").write_text("apiVersion: v1\nkind: Pod\nspec:\n" + text)
    return tmp_path / "site"


ROOT_TEMPLATE = (
    "  automountServiceAccountToken: true\n"
    "  securityContext: {runAsUser: 0, runAsNonRoot: false}\n"
    "  containers:\n"
    "    - name: task\n"
    "      securityContext: {privileged: true, allowPrivilegeEscalation: true, runAsUser: 0}\n"
)


def test_klique_fields_win_over_a_site_template_the_pool_allows(tmp_path):
    """A site template that asks for a privileged runner, root or a service account token
    is refused; where the pool allows privileged templates, the runner's container and the
    pod's token are Klique's still."""
    site = _site(tmp_path, ROOT_TEMPLATE)
    with pytest.raises(TemplateError, match="allow_privileged_templates"):
        make_driver(tmp_path, site).render(hostile_task())
    driver = make_driver(tmp_path, site)
    driver.settings = driver.settings.model_copy(update={"allow_privileged_templates": True})
    pod = driver.render(hostile_task())
    locked_down(pod)
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("  hostNetwork: true\n", "spec.hostNetwork"),
        ("  hostPID: true\n", "spec.hostPID"),
        ("  hostIPC: true\n", "spec.hostIPC"),
        ("  volumes: [{name: root, hostPath: {path: /}}]\n", "spec.volumes[0].hostPath"),
        ("  automountServiceAccountToken: true\n", "spec.automountServiceAccountToken"),
        ("  serviceAccountName: admin\n", "spec.serviceAccountName"),
        (
            "  initContainers: [{name: i, image: b, securityContext: {privileged: true}}]\n",
            "spec.initContainers[0].securityContext.privileged",
        ),
        (
            "  containers: [{name: s, securityContext: {capabilities: {add: [NET_RAW]}}}]\n",
            "spec.containers[0].securityContext.capabilities.add",
        ),
        (
            "  containers: [{name: s, securityContext: {allowPrivilegeEscalation: true}}]\n",
            "spec.containers[0].securityContext.allowPrivilegeEscalation",
        ),
        (
            "  volumes: [{name: t, projected: {sources: [{serviceAccountToken: {path: t}}]}}]\n",
            "spec.volumes[0].projected.sources.serviceAccountToken",
        ),
    ],
)
def test_a_site_template_that_adds_privileges_is_refused_at_the_pools_check(tmp_path, text, field):
    """At `klique estate check` and at server start (the pool's check): one sentence naming
    the pool, the template, the field and the setting that would allow it."""
    driver = make_driver(tmp_path, _site(tmp_path, text))
    [problem] = asyncio.run(driver.check())
    assert problem.startswith("pool k8s: pod template ") and "site/kubernetes/pod.yaml" in problem
    assert field in problem and "allow_privileged_templates: true" in problem
    assert driver.problems == [problem]  # the pool takes no task


BUILT_IN = sorted((Path(kube_pod.__file__).parents[2] / "templates" / "kubernetes").glob("*.yaml"))


@pytest.mark.parametrize("template", BUILT_IN, ids=[p.name for p in BUILT_IN])
@pytest.mark.parametrize("resource", ["cpu", "share", "gpus"])
def test_every_built_in_template_renders_a_restricted_pod(tmp_path, template, resource):
    """Every container of every pod of the shipped templates, init containers too, meets Pod
    Security "restricted" (the emulator's checker, after the standard's own checks)."""
    base = kube_pod.load_yaml(template)
    driver = make_driver(tmp_path)
    pod = kube_pod.render_pod(driver.request(hostile_task(resource)), driver.forms, base)
    assert violations(pod, "restricted") == []
    spec = pod["spec"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in spec["containers"] + spec.get("initContainers", []):
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["runAsNonRoot"] is True
        assert context["capabilities"]["drop"] == ["ALL"]
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}


def test_a_sidecar_of_a_site_template_gets_the_restricted_context_too(tmp_path):
    site = _site(
        tmp_path,
        "  initContainers: [{name: fetch, image: b}]\n  containers: [{name: shipper, image: b}]\n",
    )
    pod = make_driver(tmp_path, site).render(hostile_task())
    assert violations(pod, "restricted") == []


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("run_as_user", "0"),
        ("installation", "'two words'"),
        ("installation", "'x\\ny'"),
        ("namespace", "Not_A_Label"),
        ("pod_template", "../../etc/passwd"),
    ],
)
def test_pool_settings_that_would_break_names_or_run_as_root_are_refused(setting, value):
    with pytest.raises(EstateError):
        parse_estate(ESTATE + f"    {setting}: {value}\n")


def test_a_task_cannot_lift_its_gpu_memory_cap(tmp_path, monkeypatch):
    from inside_job.prepare import task_environment
    from inside_job.spec import TaskSpec as RunnerSpec

    driver = make_driver(tmp_path)
    document = driver.task_document(
        hostile_task("share", env={"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}), "t"
    )
    assert document["gpu_memory_limit_mb"] == 10240  # a quarter of 40G
    monkeypatch.setattr(os, "environ", {"PATH": "/usr/bin"})
    env = task_environment(RunnerSpec(document, str(tmp_path)), None, None, None)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
