"""Pod Security Standards checker: which controls a pod manifest (a dict) breaks at a level.

After https://kubernetes.io/docs/concepts/security/pod-security-standards/ ("latest") and
the Pod Security Admission controller's own checks (k8s.io/pod-security-admission, package
policy, one check_*.go per control). Each violation reads as the admission writes it,
"<reason> (<detail>)", and `forbidden_message` joins them as the API server's 403 does:

    pods "p" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation
    != false (container "c" must set securityContext.allowPrivilegeEscalation=false), ...

Order follows the admission: the baseline checks by check id, then the restricted ones by
check id, a restricted check replacing the baseline check it overrides (capabilities,
hostPath volumes, seccomp). Containers are visited as the admission visits them: init
containers, containers, then ephemeral containers. A pod with `spec.os.name: windows` skips
the Linux-only restricted checks, as the admission does since v1.25.

Pure: no I/O, no Kubernetes client. The emulator's admission and the tests of Klique's pods
call it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal

Level = Literal["baseline", "restricted"]
Pod = dict[str, Any]
Check = Callable[[Pod], "str | None"]

# Baseline "Capabilities": what may be added (the container runtime's default set).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
# Restricted "Capabilities": drop ALL, and add back only this.
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
# Baseline "Sysctls": the safe set of the latest release (v1.32 added tcp_rmem/tcp_wmem).
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    }
)
# Baseline "SELinux": the types a pod may ask for (container_engine_t since v1.31).
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
# Restricted "Volume Types": every other volume source is refused.
RESTRICTED_VOLUME_SOURCES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
SECCOMP_ALLOWED = ("RuntimeDefault", "Localhost")


# -- reading a pod -------------------------------------------------------------------------


def _spec(pod: Pod) -> dict[str, Any]:
    return pod.get("spec") or {}


def _pod_context(pod: Pod) -> dict[str, Any]:
    return _spec(pod).get("securityContext") or {}


def containers(pod: Pod) -> Iterator[dict[str, Any]]:
    """Every container in the admission's visiting order: init, regular, ephemeral."""
    spec = _spec(pod)
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _context(container: dict[str, Any]) -> dict[str, Any]:
    return container.get("securityContext") or {}


def _added(container: dict[str, Any]) -> set[str]:
    return set((_context(container).get("capabilities") or {}).get("add") or [])


def _drops_all(container: dict[str, Any]) -> bool:
    return "ALL" in ((_context(container).get("capabilities") or {}).get("drop") or [])


def _profile(context: dict[str, Any], field: str) -> str | None:
    """The `type` of an appArmorProfile or seccompProfile; None when the field is unset, ""
    when it is set without a type (which no level allows)."""
    profile = context.get(field)
    return None if profile is None else str((profile or {}).get("type", ""))


def _is_windows(pod: Pod) -> bool:
    return ((_spec(pod).get("os") or {}).get("name")) == "windows"


# -- wording, as the admission's helpers pluralize and joinQuote -----------------------------


def _plural(singular: str, plural: str, count: int) -> str:
    return singular if count == 1 else plural


def _quoted(names: list[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def _containers_phrase(names: list[str]) -> str:
    return f"{_plural('container', 'containers', len(names))} {_quoted(names)}"


def _violation(reason: str, detail: str) -> str:
    return f"{reason} ({detail})" if detail else reason


def _setters(pod_sets: bool, names: list[str]) -> list[str]:
    """The "pod and container "c"" list of who set a forbidden value."""
    who = ["pod"] if pod_sets else []
    if names:
        who.append(_containers_phrase(names))
    return who


def _must_not_add(names: list[str], added: set[str]) -> str:
    return (
        f"{_containers_phrase(names)} must not include {_quoted(sorted(added))} "
        "in securityContext.capabilities.add"
    )


def _names_where(pod: Pod, bad: Callable[[dict[str, Any]], bool]) -> list[str]:
    return [c.get("name", "") for c in containers(pod) if bad(c)]


# -- baseline ------------------------------------------------------------------------------


def app_armor_profile(pod: Pod) -> str | None:
    """Baseline "AppArmor": no Unconfined profile by field or by the beta annotation."""
    values: set[str] = set()
    pod_profile = _profile(_pod_context(pod), "appArmorProfile")
    pod_bad = pod_profile is not None and pod_profile not in SECCOMP_ALLOWED
    if pod_profile is not None and pod_bad:
        values.add(pod_profile)

    def bad(container: dict[str, Any]) -> bool:
        kind = _profile(_context(container), "appArmorProfile")
        if kind is not None and kind not in SECCOMP_ALLOWED:
            values.add(kind)
            return True
        return False

    who = _setters(pod_bad, _names_where(pod, bad))
    found = sorted(values)
    annotations = sorted(
        f'{key}="{value}"'
        for key, value in ((pod.get("metadata") or {}).get("annotations") or {}).items()
        if key.startswith(APPARMOR_ANNOTATION)
        and value not in ("", "runtime/default")
        and not value.startswith("localhost/")
    )
    if annotations:
        found += annotations
        who.append(_plural("annotation", "annotations", len(annotations)))
    if not who:
        return None
    reason = _plural("forbidden AppArmor profile", "forbidden AppArmor profiles", len(found))
    return _violation(
        reason, f"{' and '.join(who)} must not set AppArmor profile type to {_quoted(found)}"
    )


def capabilities_baseline(pod: Pod) -> str | None:
    """Baseline "Capabilities": add nothing beyond the runtime's default set."""
    added: set[str] = set()

    def bad(container: dict[str, Any]) -> bool:
        extra = _added(container) - BASELINE_CAPABILITIES
        added.update(extra)
        return bool(extra)

    names = _names_where(pod, bad)
    if not names:
        return None
    return _violation("non-default capabilities", _must_not_add(names, added))


def host_namespaces(pod: Pod) -> str | None:
    """Baseline "Host Namespaces": hostNetwork, hostPID and hostIPC stay false."""
    spec = _spec(pod)
    shared = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    return _violation("host namespaces", ", ".join(shared)) if shared else None


def host_path_volumes(pod: Pod) -> str | None:
    """Baseline "HostPath Volumes": none."""
    names = [v.get("name", "") for v in _spec(pod).get("volumes") or [] if "hostPath" in v]
    if not names:
        return None
    return _violation(
        "hostPath volumes", f"{_plural('volume', 'volumes', len(names))} {_quoted(names)}"
    )


def host_ports(pod: Pod) -> str | None:
    """Baseline "Host Ports": no hostPort (the admission allows no known list)."""
    ports: set[str] = set()

    def bad(container: dict[str, Any]) -> bool:
        used = {str(p["hostPort"]) for p in container.get("ports") or [] if p.get("hostPort")}
        ports.update(used)
        return bool(used)

    names = _names_where(pod, bad)
    if not names:
        return None
    detail = (
        f"{_containers_phrase(names)} {_plural('uses', 'use', len(names))} "
        f"{_plural('hostPort', 'hostPorts', len(ports))} {', '.join(sorted(ports))}"
    )
    return _violation("hostPort", detail)


def privileged(pod: Pod) -> str | None:
    """Baseline "Privileged Containers": securityContext.privileged stays false."""
    names = _names_where(pod, lambda c: bool(_context(c).get("privileged")))
    if not names:
        return None
    return _violation(
        "privileged", f"{_containers_phrase(names)} must not set securityContext.privileged=true"
    )


def proc_mount(pod: Pod) -> str | None:
    """Baseline "/proc Mount Type": Default (Unmasked only in a user namespace, hostUsers false)."""
    if _spec(pod).get("hostUsers") is False:
        return None
    kinds: set[str] = set()

    def bad(container: dict[str, Any]) -> bool:
        kind = _context(container).get("procMount")
        if kind is not None and kind != "Default":
            kinds.add(kind)
            return True
        return False

    names = _names_where(pod, bad)
    if not names:
        return None
    detail = (
        f"{_containers_phrase(names)} must not set securityContext.procMount to "
        f"{_quoted(sorted(kinds))}"
    )
    return _violation("procMount", detail)


def se_linux_options(pod: Pod) -> str | None:
    """Baseline "SELinux": a container type only; user and role unset."""
    types: set[str] = set()
    flags = {"user": False, "role": False}

    def bad_options(options: dict[str, Any] | None) -> bool:
        if not options:
            return False
        bad = False
        if options.get("type", "") not in SELINUX_TYPES:
            types.add(options["type"])
            bad = True
        for key in flags:
            if options.get(key):
                flags[key] = bad = True
        return bad

    pod_bad = bad_options(_pod_context(pod).get("seLinuxOptions"))
    who = _setters(
        pod_bad, _names_where(pod, lambda c: bad_options(_context(c).get("seLinuxOptions")))
    )
    if not who:
        return None
    data = [f"{_plural('type', 'types', len(types))} {_quoted(sorted(types))}"] if types else []
    data += [f"{key} may not be set" for key, set_ in flags.items() if set_]
    detail = f"{' and '.join(who)} set forbidden securityContext.seLinuxOptions: {'; '.join(data)}"
    return _violation("seLinuxOptions", detail)


def seccomp_profile_baseline(pod: Pod) -> str | None:
    """Baseline "Seccomp": not Unconfined."""
    pod_bad = _profile(_pod_context(pod), "seccompProfile") == "Unconfined"
    names = _names_where(pod, lambda c: _profile(_context(c), "seccompProfile") == "Unconfined")
    who = _setters(pod_bad, names)
    if not who:
        return None
    detail = f'{" and ".join(who)} must not set securityContext.seccompProfile.type to "Unconfined"'
    return _violation("seccompProfile", detail)


def sysctls(pod: Pod) -> str | None:
    """Baseline "Sysctls": only the safe set."""
    names = [
        s.get("name", "")
        for s in _pod_context(pod).get("sysctls") or []
        if s.get("name") not in SAFE_SYSCTLS
    ]
    return _violation("forbidden sysctls", ", ".join(names)) if names else None


def windows_host_process(pod: Pod) -> str | None:
    """Baseline "HostProcess": no Windows HostProcess pod or container."""

    def host_process(context: dict[str, Any]) -> bool:
        return bool((context.get("windowsOptions") or {}).get("hostProcess"))

    who = _setters(
        host_process(_pod_context(pod)), _names_where(pod, lambda c: host_process(_context(c)))
    )
    if not who:
        return None
    return _violation(
        "hostProcess",
        f"{' and '.join(who)} must not set securityContext.windowsOptions.hostProcess=true",
    )


# -- restricted ----------------------------------------------------------------------------


def allow_privilege_escalation(pod: Pod) -> str | None:
    """Restricted "Privilege Escalation": every container sets allowPrivilegeEscalation false."""
    if _is_windows(pod):
        return None
    names = _names_where(pod, lambda c: _context(c).get("allowPrivilegeEscalation") is not False)
    if not names:
        return None
    detail = f"{_containers_phrase(names)} must set securityContext.allowPrivilegeEscalation=false"
    return _violation("allowPrivilegeEscalation != false", detail)


def capabilities_restricted(pod: Pod) -> str | None:
    """Restricted "Capabilities": drop ALL; add back NET_BIND_SERVICE at most."""
    if _is_windows(pod):
        return None
    added: set[str] = set()

    def adds_forbidden(container: dict[str, Any]) -> bool:
        extra = _added(container) - RESTRICTED_CAPABILITIES
        added.update(extra)
        return bool(extra)

    missing_drop = _names_where(pod, lambda c: not _drops_all(c))
    adding = _names_where(pod, adds_forbidden)
    details = []
    if missing_drop:
        who = _containers_phrase(missing_drop)
        details.append(f'{who} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(_must_not_add(adding, added))
    return _violation("unrestricted capabilities", "; ".join(details)) if details else None


def _volume_source(volume: dict[str, Any]) -> str:
    sources = [key for key in volume if key != "name"]
    return sources[0] if sources else "unknown"


def restricted_volumes(pod: Pod) -> str | None:
    """Restricted "Volume Types": only the sources in RESTRICTED_VOLUME_SOURCES."""
    bad = [
        (v.get("name", ""), _volume_source(v))
        for v in _spec(pod).get("volumes") or []
        if _volume_source(v) not in RESTRICTED_VOLUME_SOURCES
    ]
    if not bad:
        return None
    names = [name for name, _ in bad]
    kinds = sorted({kind for _, kind in bad})
    volumes = f"{_plural('volume', 'volumes', len(names))} {_quoted(names)}"
    types = _plural("restricted volume type", "restricted volume types", len(kinds))
    detail = f"{volumes} {_plural('uses', 'use', len(names))} {types} {_quoted(kinds)}"
    return _violation("restricted volume types", detail)


def run_as_non_root(pod: Pod) -> str | None:
    """Restricted "Running as Non-root": runAsNonRoot true on the pod or on every container."""
    pod_value = _pod_context(pod).get("runAsNonRoot")
    explicit = _names_where(pod, lambda c: _context(c).get("runAsNonRoot") is False)
    who = _setters(pod_value is False, explicit)
    if who:
        return _violation(
            "runAsNonRoot != true",
            f"{' and '.join(who)} must not set securityContext.runAsNonRoot=false",
        )
    if pod_value is True:
        return None
    implicit = _names_where(pod, lambda c: _context(c).get("runAsNonRoot") is None)
    if not implicit:
        return None
    detail = f"pod or {_containers_phrase(implicit)} must set securityContext.runAsNonRoot=true"
    return _violation("runAsNonRoot != true", detail)


def run_as_user(pod: Pod) -> str | None:
    """Restricted "Running as Non-root user": runAsUser is never 0."""
    who = _setters(
        _pod_context(pod).get("runAsUser") == 0,
        _names_where(pod, lambda c: _context(c).get("runAsUser") == 0),
    )
    return (
        _violation("runAsUser=0", f"{' and '.join(who)} must not set runAsUser=0") if who else None
    )


def seccomp_profile_restricted(pod: Pod) -> str | None:
    """Restricted "Seccomp": RuntimeDefault or Localhost, on the pod or on every container."""
    if _is_windows(pod):
        return None
    values: set[str] = set()
    pod_type = _profile(_pod_context(pod), "seccompProfile")
    pod_bad = pod_type is not None and pod_type not in SECCOMP_ALLOWED
    if pod_type is not None and pod_bad:
        values.add(pod_type)

    def explicit_bad(container: dict[str, Any]) -> bool:
        kind = _profile(_context(container), "seccompProfile")
        if kind is not None and kind not in SECCOMP_ALLOWED:
            values.add(kind)
            return True
        return False

    who = _setters(pod_bad, _names_where(pod, explicit_bad))
    if who:
        bad = _quoted(sorted(values))
        detail = f"{' and '.join(who)} must not set securityContext.seccompProfile.type to {bad}"
        return _violation("seccompProfile", detail)
    if pod_type is not None:
        return None
    implicit = _names_where(pod, lambda c: _context(c).get("seccompProfile") is None)
    if not implicit:
        return None
    detail = (
        f"pod or {_containers_phrase(implicit)} must set securityContext.seccompProfile.type "
        'to "RuntimeDefault" or "Localhost"'
    )
    return _violation("seccompProfile", detail)


# Each level's checks in the admission's order; a restricted check replaces the baseline
# check it overrides (capabilities_baseline, hostPathVolumes, seccompProfile_baseline).
BASELINE_CHECKS: tuple[Check, ...] = (
    app_armor_profile,
    capabilities_baseline,
    host_namespaces,
    host_path_volumes,
    host_ports,
    privileged,
    proc_mount,
    se_linux_options,
    seccomp_profile_baseline,
    sysctls,
    windows_host_process,
)
RESTRICTED_CHECKS: tuple[Check, ...] = (
    allow_privilege_escalation,
    capabilities_restricted,
    restricted_volumes,
    run_as_non_root,
    run_as_user,
    seccomp_profile_restricted,
)
OVERRIDDEN_BY_RESTRICTED = frozenset(
    {capabilities_baseline, host_path_volumes, seccomp_profile_baseline}
)


def checks(level: Level) -> tuple[Check, ...]:
    """The checks a namespace at `level` runs, in the order the admission reports them."""
    if level == "baseline":
        return BASELINE_CHECKS
    if level == "restricted":
        kept = tuple(c for c in BASELINE_CHECKS if c not in OVERRIDDEN_BY_RESTRICTED)
        return kept + RESTRICTED_CHECKS
    raise ValueError(f'unknown Pod Security level "{level}": use "baseline" or "restricted"')


def violations(pod: Pod, level: Level) -> list[str]:
    """What `pod` breaks at `level`, each as "<reason> (<detail>)"; [] when it is admitted."""
    return [found for check in checks(level) if (found := check(pod)) is not None]


def forbidden_message(pod: Pod, level: Level, version: str = "latest") -> str | None:
    """The API server's 403 message for `pod` in a namespace enforcing `level`; None if admitted."""
    found = violations(pod, level)
    if not found:
        return None
    name = (pod.get("metadata") or {}).get("name", "")
    return (
        f'pods "{name}" is forbidden: violates PodSecurity "{level}:{version}": {", ".join(found)}'
    )
