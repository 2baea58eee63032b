"""A Kubernetes pool's pod templates as files: found (the site's templates first), loaded
for a compute resource, and refused where they add privileges the pool does not allow
(`allow_privileged_templates`; the fields are kube_pod.privileges's). docs/kubernetes.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.domain import Estate
from broker.errors import TemplateError
from broker.pools import kube_pod
from broker.pools.kube_settings import KubernetesSettings
from broker.templates import search_roots


def base_template(settings: KubernetesSettings, estate: Estate) -> Path:
    """The pool's base pod template: `kubernetes/<pod_template>.yaml`."""
    return kube_pod.find_base(settings.pod_template, search_roots(estate.templates_dir))


def load(
    settings: KubernetesSettings, estate: Estate, resource: str
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The pool's base pod template and the compute resource's overrides (None: it has none)."""
    base = kube_pod.load_yaml(base_template(settings, estate))
    found = kube_pod.find_overrides(resource, search_roots(estate.templates_dir))
    return base, kube_pod.load_yaml(found) if found else None


def template_problems(pool: str, settings: KubernetesSettings, estate: Estate) -> list[str]:
    """The pod templates this pool uses (its base, with each of its compute resources'
    overrides) that add privileges the pool does not allow: one sentence per field."""
    if settings.allow_privileged_templates:
        return []
    roots = search_roots(estate.templates_dir)
    try:
        base_path = base_template(settings, estate)
        base = kube_pod.load_yaml(base_path)
    except TemplateError as exc:
        return [str(exc)]
    problems = [_privilege(pool, base_path, field) for field in kube_pod.privileges(base)]
    for name, resource in sorted(estate.resources.items()):
        found = kube_pod.find_overrides(name, roots)
        if found is None or pool not in resource.profile.pools:
            continue
        try:
            merged = kube_pod.merge(base, kube_pod.load_yaml(found))
        except TemplateError as exc:
            problems.append(str(exc))
            continue
        problems += [
            _privilege(pool, found, field)
            for field in kube_pod.privileges(merged)
            if field not in kube_pod.privileges(base)
        ]
    return problems


def _privilege(pool: str, template: Path, field: str) -> str:
    return (
        f"pool {pool}: pod template {template}: {field} adds privileges; remove "
        "it, or set allow_privileged_templates: true on the pool to allow it"
    )
