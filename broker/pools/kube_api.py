"""The Kubernetes API as the Kubernetes pool uses it: a thin adapter over lightkube's async
client, in plain dicts, so that the driver (and its tests) depend on these few calls only.

Scoped to one namespace: pods, secrets and configmaps there, nothing else (the Role in
docs/kubernetes.md grants exactly these verbs). Errors become KliqueErrors with the API's words:
`Gone` for an expired resourceVersion (HTTP 410, or a watch's ERROR event with code 410;
https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes),
`Conflict` for a name that exists (409), TransportError when the API cannot be reached.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx2  # lightkube 1.x speaks httpx2
from lightkube import ApiError, AsyncClient, KubeConfig, codecs
from lightkube.config.kubeconfig import SingleConfig
from lightkube.config.models import Cluster, User
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ConfigMap, Pod, Secret
from lightkube.types import CascadeType

from broker.errors import KliqueError, TransportError

# Kueue's Workload (kueue.x-k8s.io/v1beta1), read only: why a Job waits.
Workload = create_namespaced_resource("kueue.x-k8s.io", "v1beta1", "Workload", "workloads")


class KubeError(KliqueError):
    """The API refused a request: its status code and message (and its Retry-After, seconds)."""

    def __init__(self, code: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"Kubernetes API: {message} (HTTP {code})")
        self.code = code
        self.message = message
        self.retry_after = retry_after


class Gone(KubeError):
    """The resourceVersion a watch asked for is no longer kept: list again."""


class Conflict(KubeError):
    """An object of that name exists."""


class NotFound(KubeError):
    pass


def _error(exc: Exception) -> KliqueError:
    if isinstance(exc, ApiError):
        code = int(exc.status.code or 0)
        message = exc.status.message or str(exc)
        kind = {410: Gone, 409: Conflict, 404: NotFound}.get(code, KubeError)
        return kind(code, message, _retry_after(exc))
    if isinstance(exc, ValueError):  # an answer that is not the API's JSON (a proxy's page)
        return TransportError(f"the Kubernetes API's answer could not be read: {exc}")
    return TransportError(f"the Kubernetes API could not be reached: {exc}")


def _retry_after(exc: ApiError) -> float | None:
    """Retry-After in seconds (API Priority and Fairness sends it with 429), or None."""
    response = getattr(exc, "response", None)
    value = response.headers.get("Retry-After") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _plain(obj: Any) -> dict[str, Any]:
    data: dict[str, Any] = obj.to_dict()
    return data


class KubeApi:
    """One namespace of one cluster."""

    def __init__(
        self,
        namespace: str,
        server: str | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        token_file: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.namespace = namespace
        config: KubeConfig | SingleConfig | None
        if server:  # a service account token (file) and the cluster's CA, or none (tests)
            config = KubeConfig.from_one(
                cluster=Cluster(server=server, certificate_auth=ca_file),
                user=User(token_file=token_file),
                namespace=namespace,
            )
        elif kubeconfig:
            config = KubeConfig.from_file(kubeconfig).get(context_name=context)
        else:
            config = KubeConfig.from_env()  # in a pod: its service account; else ~/.kube/config
        self._client = AsyncClient(config, namespace=namespace, trust_env=False)

    async def close(self) -> None:
        await self._client.close()

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create a Pod, Secret or ConfigMap in the namespace."""
        try:
            created = await self._client.create(codecs.from_dict(dict(manifest)))
        except (ApiError, httpx2.HTTPError, ValueError) as exc:
            raise _error(exc) from exc
        return _plain(created)

    async def get_pod(self, name: str) -> dict[str, Any] | None:
        """The pod of that name, or None (a create whose answer was lost is looked up so)."""
        try:
            return _plain(await self._client.get(Pod, name))
        except (ApiError, httpx2.HTTPError, ValueError) as exc:
            error = _error(exc)
            if isinstance(error, NotFound):
                return None
            raise error from exc

    async def get_config_map(self, name: str) -> dict[str, Any] | None:
        try:
            return _plain(await self._client.get(ConfigMap, name))
        except (ApiError, httpx2.HTTPError) as exc:
            error = _error(exc)
            if isinstance(error, NotFound):
                return None
            raise error from exc

    async def delete(self, kind: str, name: str, grace_s: int | None = None) -> bool:
        """Delete a pod or secret; False when it was gone already."""
        resource: Any = {"Pod": Pod, "Secret": Secret, "ConfigMap": ConfigMap, "Job": Job}[kind]
        # A Job's pods go with it (the API's default for Jobs orphans them).
        cascade = CascadeType.BACKGROUND if kind == "Job" else None
        try:
            await self._client.delete(resource, name, grace_period=grace_s, cascade=cascade)
        except (ApiError, httpx2.HTTPError) as exc:
            error = _error(exc)
            if isinstance(error, NotFound):
                return False
            raise error from exc
        return True

    async def list_workloads(self) -> list[dict[str, Any]]:
        """Kueue's Workloads in the namespace (a Kueue pool asks why its Jobs wait)."""
        try:
            return [_plain(w) async for w in self._client.list(Workload)]
        except (ApiError, httpx2.HTTPError, ValueError) as exc:
            raise _error(exc) from exc

    async def get_job(self, name: str) -> dict[str, Any] | None:
        try:
            return _plain(await self._client.get(Job, name))
        except (ApiError, httpx2.HTTPError, ValueError) as exc:
            error = _error(exc)
            if isinstance(error, NotFound):
                return None
            raise error from exc

    async def list_pods(self, labels: Mapping[str, str]) -> tuple[list[dict[str, Any]], str]:
        """Every pod with these labels, and the list's resourceVersion (to watch from)."""
        try:
            listing = self._client.list(Pod, labels=dict(labels))
            pods = [_plain(pod) async for pod in listing]
            return pods, listing.resourceVersion
        except (ApiError, httpx2.HTTPError) as exc:
            raise _error(exc) from exc

    async def watch_pods(
        self, labels: Mapping[str, str], resource_version: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Changes after resource_version: (ADDED | MODIFIED | DELETED, pod). Ends when the
        server ends the watch; raises Gone when the version has expired."""
        try:
            async for kind, pod in self._client.watch(
                Pod,
                labels=dict(labels),
                resource_version=resource_version,
                on_error=_raise,
            ):
                yield kind, _plain(pod)
        except (ApiError, httpx2.HTTPError) as exc:
            raise _error(exc) from exc

    async def pod_log(self, name: str, container: str, tail_lines: int | None = None) -> str:
        """One container's log: named, as the API requires of a pod with several."""
        try:
            lines = [
                line
                async for line in self._client.log(name, container=container, tail_lines=tail_lines)
            ]
        except (ApiError, httpx2.HTTPError) as exc:
            raise _error(exc) from exc
        return "".join(lines)


def _raise(exc: Exception, count: int) -> Any:
    """Every failure of a watch goes to the driver (lightkube would retry it, and after 410
    Gone restart from no version at all); a watch the server ended is resumed by lightkube
    from the last version seen."""
    from lightkube.types import OnErrorAction, OnErrorResult

    return OnErrorResult(OnErrorAction.RAISE)
