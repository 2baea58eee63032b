"""The Pod Security Standards checker of the Kubernetes emulator, on the standard's own cases.

Each control of https://kubernetes.io/docs/concepts/security/pod-security-standards/ is tried
with a value the standard allows and one it forbids; the wording expected is the admission's
(k8s.io/pod-security-admission), as a real API server answers it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from fakes._kubesim.pod_security import checks, forbidden_message, violations

from broker.pools.kube_pod import GpuForms, PodRequest, load_yaml, merge, render_pod

RESTRICTED_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def pod(spec: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    """A pod of one container "c" that passes `restricted`, with `spec` merged over it."""
    base: dict[str, Any] = {
        "metadata": {"name": "p", **meta},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {"name": "c", "image": "i", "securityContext": copy.deepcopy(RESTRICTED_CONTEXT)}
            ],
        },
    }
    base["spec"].update(spec or {})
    return base


def with_container_context(**context: Any) -> dict[str, Any]:
    """The restricted pod, its container's securityContext updated with `context`."""
    built = pod()
    built["spec"]["containers"][0]["securityContext"].update(context)
    return built


def bare() -> dict[str, Any]:
    """The minimally specified pod: what `kubectl run` makes."""
    return {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}


def test_a_hardened_pod_passes_both_levels() -> None:
    assert violations(pod(), "restricted") == []
    assert violations(pod(), "baseline") == []
    assert forbidden_message(pod(), "restricted") is None


def test_the_default_pod_passes_baseline_and_fails_restricted_as_the_api_server_says() -> None:
    assert violations(bare(), "baseline") == []
    assert forbidden_message(bare(), "restricted") == (
        'pods "bare" is forbidden: violates PodSecurity "restricted:latest": '
        "allowPrivilegeEscalation != false "
        '(container "c" must set securityContext.allowPrivilegeEscalation=false), '
        "unrestricted capabilities "
        '(container "c" must set securityContext.capabilities.drop=["ALL"]), '
        'runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true), '
        'seccompProfile (pod or container "c" must set securityContext.seccompProfile.type '
        'to "RuntimeDefault" or "Localhost")'
    )


# (case, pod, the violation both levels report)
BASELINE_FORBIDDEN = [
    ("hostNetwork", pod({"hostNetwork": True}), "host namespaces (hostNetwork=true)"),
    (
        "hostPID and hostIPC",
        pod({"hostPID": True, "hostIPC": True}),
        "host namespaces (hostPID=true, hostIPC=true)",
    ),
    (
        "privileged",
        with_container_context(privileged=True),
        'privileged (container "c" must not set securityContext.privileged=true)',
    ),
    (
        "hostPort",
        pod(
            {
                "containers": [
                    {
                        "name": "c",
                        **pod()["spec"]["containers"][0],
                        "ports": [{"containerPort": 80, "hostPort": 9100}],
                    }
                ]
            }
        ),
        'hostPort (container "c" uses hostPort 9100)',
    ),
    (
        "AppArmor Unconfined on the pod",
        pod(
            {
                "securityContext": {
                    **pod()["spec"]["securityContext"],
                    "appArmorProfile": {"type": "Unconfined"},
                }
            }
        ),
        'forbidden AppArmor profile (pod must not set AppArmor profile type to "Unconfined")',
    ),
    (
        "AppArmor unconfined by annotation",
        pod(annotations={"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}),
        "forbidden AppArmor profile (annotation must not set AppArmor profile type to "
        '"container.apparmor.security.beta.kubernetes.io/c="unconfined"")',
    ),
    (
        "SELinux type and user",
        with_container_context(seLinuxOptions={"type": "spc_t", "user": "system_u"}),
        'seLinuxOptions (container "c" set forbidden securityContext.seLinuxOptions: '
        'type "spc_t"; user may not be set)',
    ),
    (
        "procMount Unmasked",
        with_container_context(procMount="Unmasked"),
        'procMount (container "c" must not set securityContext.procMount to "Unmasked")',
    ),
    (
        "unsafe sysctl",
        pod(
            {
                "securityContext": {
                    **pod()["spec"]["securityContext"],
                    "sysctls": [{"name": "kernel.msgmax", "value": "1"}],
                }
            }
        ),
        "forbidden sysctls (kernel.msgmax)",
    ),
    (
        "Windows HostProcess",
        with_container_context(windowsOptions={"hostProcess": True}),
        'hostProcess (container "c" must not set securityContext.windowsOptions.hostProcess=true)',
    ),
]


@pytest.mark.parametrize(
    "built,expected",
    [case[1:] for case in BASELINE_FORBIDDEN],
    ids=[c[0] for c in BASELINE_FORBIDDEN],
)
@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_a_baseline_control_refuses_at_both_levels(
    built: dict[str, Any], expected: str, level: Any
) -> None:
    assert violations(built, level) == [expected]


BASELINE_ALLOWED = [
    ("host namespaces false", pod({"hostNetwork": False, "hostPID": False, "hostIPC": False})),
    (
        "a default capability added",
        with_container_context(capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}),
    ),
    (
        "SELinux container_t",
        with_container_context(seLinuxOptions={"type": "container_t", "level": "s0:c1"}),
    ),
    (
        "AppArmor localhost profile",
        pod(annotations={"container.apparmor.security.beta.kubernetes.io/c": "localhost/p"}),
    ),
    (
        "AppArmor RuntimeDefault field",
        with_container_context(appArmorProfile={"type": "RuntimeDefault"}),
    ),
    ("procMount Default", with_container_context(procMount="Default")),
    (
        "a safe sysctl",
        pod(
            {
                "securityContext": {
                    **pod()["spec"]["securityContext"],
                    "sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}],
                }
            }
        ),
    ),
    (
        "containerPort without hostPort",
        pod({"containers": [{**pod()["spec"]["containers"][0], "ports": [{"containerPort": 80}]}]}),
    ),
]


@pytest.mark.parametrize(
    "built", [c[1] for c in BASELINE_ALLOWED], ids=[c[0] for c in BASELINE_ALLOWED]
)
def test_what_the_standard_allows_passes(built: dict[str, Any]) -> None:
    assert violations(built, "restricted") == []


def test_baseline_refuses_non_default_capabilities_and_restricted_all_but_net_bind_service() -> (
    None
):
    built = with_container_context(capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN", "CHOWN"]})
    assert violations(built, "baseline") == [
        'non-default capabilities (container "c" must not include "SYS_ADMIN" in '
        "securityContext.capabilities.add)"
    ]
    assert violations(built, "restricted") == [
        'unrestricted capabilities (container "c" must not include "CHOWN", "SYS_ADMIN" in '
        "securityContext.capabilities.add)"
    ]


def test_host_path_is_a_baseline_volume_and_a_restricted_volume_type() -> None:
    built = pod(
        {"volumes": [{"name": "h", "hostPath": {"path": "/etc"}}, {"name": "e", "emptyDir": {}}]}
    )
    assert violations(built, "baseline") == ['hostPath volumes (volume "h")']
    assert violations(built, "restricted") == [
        'restricted volume types (volume "h" uses restricted volume type "hostPath")'
    ]


def test_restricted_volume_types_allow_only_the_listed_sources() -> None:
    allowed = [
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ]
    fine = pod({"volumes": [{"name": kind.lower(), kind: {}} for kind in allowed]})
    assert violations(fine, "restricted") == []
    refused = pod({"volumes": [{"name": "n", "nfs": {}}, {"name": "g", "gitRepo": {}}]})
    assert violations(refused, "baseline") == []
    assert violations(refused, "restricted") == [
        'restricted volume types (volumes "n", "g" use restricted volume types "gitRepo", "nfs")'
    ]


def test_seccomp_unconfined_is_refused_at_both_levels() -> None:
    built = with_container_context(seccompProfile={"type": "Unconfined"})
    expected = (
        'seccompProfile (container "c" must not set securityContext.seccompProfile.type '
        'to "Unconfined")'
    )
    assert violations(built, "baseline") == [expected]
    assert violations(built, "restricted") == [expected]


def test_seccomp_set_on_every_container_satisfies_restricted_without_the_pod_level() -> None:
    built = with_container_context(
        seccompProfile={"type": "Localhost", "localhostProfile": "p.json"}
    )
    del built["spec"]["securityContext"]["seccompProfile"]
    assert violations(built, "restricted") == []


def test_run_as_non_root_false_and_run_as_user_zero_are_named_with_who_set_them() -> None:
    built = pod(
        {
            "securityContext": {
                "runAsNonRoot": False,
                "runAsUser": 0,
                "seccompProfile": {"type": "RuntimeDefault"},
            }
        }
    )
    built["spec"]["containers"][0]["securityContext"]["runAsUser"] = 0
    assert violations(built, "baseline") == []
    assert violations(built, "restricted") == [
        "runAsNonRoot != true (pod must not set securityContext.runAsNonRoot=false)",
        'runAsUser=0 (pod and container "c" must not set runAsUser=0)',
    ]


def test_privilege_escalation_must_be_false_on_init_containers_too() -> None:
    built = pod(
        {
            "initContainers": [
                {
                    "name": "init",
                    "image": "i",
                    "securityContext": {"capabilities": {"drop": ["ALL"]}},
                }
            ]
        }
    )
    assert violations(built, "restricted") == [
        "allowPrivilegeEscalation != false "
        '(container "init" must set securityContext.allowPrivilegeEscalation=false)'
    ]


def test_several_containers_are_listed_in_the_admissions_order() -> None:
    built = bare()
    built["spec"]["containers"].append(
        {"name": "side", "image": "i", "securityContext": {"privileged": True}}
    )
    built["spec"]["initContainers"] = [
        {"name": "init", "image": "i", "securityContext": {"privileged": True}}
    ]
    assert violations(built, "baseline") == [
        'privileged (containers "init", "side" must not set securityContext.privileged=true)'
    ]


def test_a_windows_pod_skips_the_linux_only_restricted_checks() -> None:
    built = bare()
    built["spec"]["os"] = {"name": "windows"}
    built["spec"]["securityContext"] = {"runAsNonRoot": True}
    assert violations(built, "restricted") == []


def test_an_unknown_level_is_refused_with_the_levels_named() -> None:
    level: Any = "privileged"  # a namespace's label, as read: not one of the two levels
    with pytest.raises(ValueError, match='use "baseline" or "restricted"'):
        checks(level)


# -- Klique's own pods ---------------------------------------------------------------------

TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "kubernetes"
GPU_FORMS: dict[str, tuple[dict[str, Any], GpuForms]] = {
    "cpu only": ({}, GpuForms()),
    "whole gpus": ({"gpus": 2}, GpuForms()),
    "fraction on a mig slice": ({"gpu_fraction": 0.25}, GpuForms(mig="nvidia.com/mig-1g.10gb")),
    "fraction time-sliced": (
        {"gpu_fraction": 0.5},
        GpuForms(shared="nvidia.com/gpu.shared", gpu_memory_mb=81920),
    ),
    "fraction without sharing": ({"gpu_fraction": 0.5}, GpuForms()),
    "gpu memory time-sliced": (
        {"gpu_memory_mb": 20480},
        GpuForms(shared="nvidia.com/gpu.shared", gpu_memory_mb=81920),
    ),
}


def request(**gpu: Any) -> PodRequest:
    return PodRequest(
        name="klique-7-1",
        task_id=7,
        attempt=1,
        pool="k8s",
        installation="abc123",
        image="registry.example/team/py:3.12",
        python="python3",
        job_dir="/klique/job",
        secret="klique-7-1",
        runner_config_map="klique-runner",
        cpus=2,
        memory_mb=4096,
        walltime_s=3600,
        **gpu,
    )


@pytest.mark.parametrize("template", sorted(TEMPLATES.glob("*.yaml")), ids=lambda p: p.name)
@pytest.mark.parametrize("form", GPU_FORMS, ids=list(GPU_FORMS))
def test_every_built_in_template_renders_a_pod_that_restricted_admits(template: Path, form: str):
    gpu, forms = GPU_FORMS[form]
    pod = render_pod(request(**gpu), forms, load_yaml(template))
    assert forbidden_message(pod, "restricted") is None


def test_a_site_template_allowed_privileges_renders_a_pod_that_restricted_refuses():
    base = load_yaml(TEMPLATES / "pod.yaml")
    privileged = {"spec": {"hostNetwork": True}}
    pod = render_pod(request(), GpuForms(), merge(base, privileged), allow_privileged=True)
    assert violations(pod, "restricted") == ["host namespaces (hostNetwork=true)"]


def test_a_seccomp_profile_without_a_type_is_no_profile_restricted_allows():
    built = with_container_context(seccompProfile={})
    del built["spec"]["securityContext"]["seccompProfile"]
    assert violations(built, "restricted") == [
        'seccompProfile (container "c" must not set securityContext.seccompProfile.type to "")'
    ]
