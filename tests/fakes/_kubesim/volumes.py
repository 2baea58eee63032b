"""A pod's volumes on the node, laid out as the kubelet lays them out.

ConfigMap, Secret and downwardAPI volumes use the kubelet's atomic writer
(pkg/volume/util/atomic_writer.go): the files live in a hidden timestamped folder, `..data` is a
symlink to it and each key a symlink through `..data`; an update writes a new folder and renames
a new `..data` over the old, so a reader sees the old files or the new ones, never a mix. They
are mounted read-only. emptyDir is a world-writable folder. A missing ConfigMap or Secret (not
`optional`) is a MountFailed: the kubelet keeps the pod in ContainerCreating and retries."""

from __future__ import annotations

import base64
import os
import shutil
import time
from pathlib import Path
from typing import Any

from .store import Store

DATA = "..data"


class MountFailed(Exception):
    """A volume cannot be set up yet (its message is the kubelet's event)."""


def field_value(pod: dict[str, Any], path: str) -> str:
    """A downward API fieldRef (kubernetes.io/docs/concepts/workloads/pods/downward-api/)."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIP": status.get("podIP", ""),
    }
    if path in simple:
        return str(simple[path])
    for field in ("labels", "annotations"):
        values = meta.get(field) or {}
        if path == f"metadata.{field}":
            return "".join(f'{k}="{v}"\n' for k, v in sorted(values.items()))
        prefix = f"metadata.{field}['"
        if path.startswith(prefix) and path.endswith("']"):
            return str(values.get(path[len(prefix) : -2], ""))
    raise MountFailed(f"unsupported fieldRef {path!r}")


def source_files(
    store: Store, ns: str, pod: dict[str, Any], volume: dict[str, Any]
) -> dict[str, bytes]:
    """The files of a configMap, secret or downwardAPI volume, by relative path."""
    name = volume["name"]
    if "downwardAPI" in volume:
        return {
            item["path"]: field_value(pod, item["fieldRef"]["fieldPath"]).encode()
            for item in volume["downwardAPI"].get("items", [])
        }
    if "configMap" in volume:
        source, plural, kind = volume["configMap"], "configmaps", "configmap"
        obj_name = source.get("name", "")
    else:
        source, plural, kind = volume["secret"], "secrets", "secret"
        obj_name = source.get("secretName", "")
    obj = store.get(ns, plural, obj_name)
    if obj is None:
        if source.get("optional"):
            return {}
        raise MountFailed(
            f'MountVolume.SetUp failed for volume "{name}" : {kind} "{obj_name}" not found'
        )
    data: dict[str, bytes] = {}
    for key, value in (obj.get("data") or {}).items():
        data[key] = base64.b64decode(value) if plural == "secrets" else str(value).encode()
    for key, value in (obj.get("binaryData") or {}).items():
        data[key] = base64.b64decode(value)
    for key, value in (obj.get("stringData") or {}).items():
        data[key] = str(value).encode()
    items = source.get("items")
    if items:
        return {item["path"]: data[item["key"]] for item in items if item["key"] in data}
    return data


def default_mode(volume: dict[str, Any]) -> int:
    for kind in ("configMap", "secret", "downwardAPI"):
        if kind in volume:
            return int(volume[kind].get("defaultMode", 0o644))
    return 0o644


def write_atomically(folder: Path, files: dict[str, bytes], mode: int) -> None:
    """The atomic writer's layout: ..<time>/files, ..data -> ..<time>, key -> ..data/key."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = folder / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    stamp.mkdir(mode=0o755)
    for path, data in files.items():
        target = stamp / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)
    old = os.readlink(folder / DATA) if (folder / DATA).is_symlink() else None
    tmp = folder / "..data_tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(stamp.name)
    os.rename(tmp, folder / DATA)  # the one atomic step: readers switch at once
    tops = {path.split("/", 1)[0] for path in files}
    for top in tops:
        link = folder / top
        if not link.is_symlink():
            link.symlink_to(f"{DATA}/{top}")
    for entry in folder.iterdir():
        if not entry.name.startswith("..") and entry.name not in tops:
            entry.unlink()
    if old is not None:
        shutil.rmtree(folder / old, ignore_errors=True)


def set_up(store: Store, ns: str, pod: dict[str, Any], root: Path) -> dict[str, Path]:
    """Every volume of the pod under root/volumes: the host folder of each, by name."""
    local: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes", []):
        path = root / "volumes" / volume["name"]
        if "emptyDir" in volume:
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)  # as the kubelet makes an emptyDir
        elif any(k in volume for k in ("configMap", "secret", "downwardAPI")):
            write_atomically(path, source_files(store, ns, pod, volume), default_mode(volume))
        else:
            kinds = sorted(set(volume) - {"name"})
            raise MountFailed(
                f'volume "{volume["name"]}": {kinds} is not emulated '
                "(emptyDir, configMap, secret and downwardAPI are)"
            )
        local[volume["name"]] = path
    return local


def refresh(store: Store, ns: str, pod: dict[str, Any], root: Path) -> None:
    """Rewrite the pod's ConfigMap and Secret volumes after their objects changed (the kubelet's
    periodic sync); files that are the same are left as they are."""
    for volume in pod["spec"].get("volumes", []):
        if "configMap" not in volume and "secret" not in volume:
            continue
        path = root / "volumes" / volume["name"]
        try:
            files = source_files(store, ns, pod, volume)
        except MountFailed:
            continue  # a deleted source leaves the mounted files, as on a node
        current = {p: (path / p).read_bytes() for p in files if (path / p).is_file()}
        if current != files:
            write_atomically(path, files, default_mode(volume))


def mount_source(local: dict[str, Path], mount: dict[str, Any]) -> Path:
    """A volumeMount's host path: the volume's folder, or the file or folder its subPath names
    (resolved through the ..data symlinks, so a subPath file is never updated: as on a node)."""
    source = local[mount["name"]]
    if mount.get("subPath"):
        source = source / mount["subPath"]
        if not source.exists():
            source.mkdir(parents=True, mode=0o777)  # the kubelet makes a missing subPath folder
    return source.resolve()
