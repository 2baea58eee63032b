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
from lightkube.resources.core_v1 import ConfigMap, Pod, Secret

from broker.errors import KliqueError, TransportError


class KubeError(KliqueError):
    """The API refused a request: its status code and message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"Kubernetes API: {message} (HTTP {code})")
        self.code = code


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
        return kind(code, message)
    return TransportError(f"the Kubernetes API could not be reached: {exc}")


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
        except (ApiError, httpx2.HTTPError) as exc:
            raise _error(exc) from exc
        return _plain(created)

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
        resource: Any = {"Pod": Pod, "Secret": Secret, "ConfigMap": ConfigMap}[kind]
        try:
            await self._client.delete(resource, name, grace_period=grace_s)
        except (ApiError, httpx2.HTTPError) as exc:
            error = _error(exc)
            if isinstance(error, NotFound):
                return False
            raise error from exc
        return True

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

    async def pod_log(self, name: str, tail_lines: int | None = None) -> str:
        try:
            lines = [line async for line in self._client.log(name, tail_lines=tail_lines)]
        except (ApiError, httpx2.HTTPError) as exc:
            raise _error(exc) from exc
        return "".join(lines)


def _raise(exc: Exception, count: int) -> Any:
    """Every failure of a watch goes to the driver (lightkube would retry it, and after 410
    Gone restart from no version at all); a watch the server ended is resumed by lightkube
    from the last version seen."""
    from lightkube.types import OnErrorAction, OnErrorResult

    return OnErrorResult(OnErrorAction.RAISE)
