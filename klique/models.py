"""The model registry from the SDK's side: a run registers a model (a file or a folder, its
files uploaded as the run's artifacts), and anyone of its team reads a version back by number
or stage, into a private cache checked against each file's SHA-256.

    task.register_model("resnet", "model.pt", framework="pytorch", tags=["baseline"])
    klique.OutputModel(task=task, name="resnet").update_weights(weights_filename="model.pt")
    (klique/output_model.py)
    path = klique.Model.get("resnet", stage="production").get_local_copy()
"""

from __future__ import annotations

import os
import re
import secrets
import urllib.parse

from inside_job.digests import sha256_of
from klique._api import Api, KliqueError
from klique._names import PART, check_versioned_name
from klique.artifacts import cache_dir, fetch_checked, upload

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

STAGES = ("none", "staging", "production", "archived")


def check_name(name: str) -> str:
    return check_versioned_name("model", name)


def model_files(path: str) -> List[str]:
    """The files of a model folder, as relative paths with '/'; hidden files are left out
    (a registry path is plain names only)."""
    found = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if PART.match(d))
        for name in sorted(files):
            full = os.path.join(root, name)
            if PART.match(name) and os.path.isfile(full):
                found.append(os.path.relpath(full, path).replace(os.sep, "/"))
    return found


def register(
    api: Api,
    task_id: int,
    name: str,
    path: str,
    framework: Optional[str] = None,
    metadata: Optional[Dict[str, Any]] = None,
    tags: Optional[List[str]] = None,
) -> Model:
    """A new version of model `name` made by task `task_id`: the file or folder at `path`,
    uploaded as the task's artifacts, then registered."""
    check_name(name)
    path = os.fspath(path)
    if os.path.isfile(path):
        kind, relative = "file", [os.path.basename(path)]
        sources = [path]
    elif os.path.isdir(path):
        kind, relative = "folder", model_files(path)
        sources = [os.path.join(path, *r.split("/")) for r in relative]
        if not relative:
            raise KliqueError(f"{path} holds no files to register as model {name}")
    else:
        raise KliqueError(f"{path} is neither a file nor a folder; a model is one of those")
    batch = secrets.token_hex(4)  # artifacts of this registration, apart from earlier ones
    files = []
    for index, (rel, source) in enumerate(zip(relative, sources)):
        artifact = f"model.{name[:100]}.{batch}.{index}"
        upload(api, task_id, artifact, source)
        files.append({"path": _plain(rel), "artifact": artifact})
    body = {
        "name": name,
        "task": int(task_id),
        "kind": kind,
        "files": files,
        "framework": framework or "",
        "metadata": dict(metadata or {}),
        "tags": list(tags or []),
    }
    return Model(api, api.post("/models", body))


def _plain(path: str) -> str:
    """A file's own name made plain enough for the registry (letters, digits, . _ + - space)."""
    parts = [re.sub(r"[^A-Za-z0-9._ +-]", "_", p).lstrip(".") or "_" for p in path.split("/")]
    return "/".join(parts)


class Model:
    """One version of a registered model: .version, .stage, .files, .metrics, .task_id;
    .get_local_copy() downloads it."""

    def __init__(self, api: Api, info: Dict[str, Any]) -> None:
        self._api = api
        self.info = info
        self.name: str = info["name"]
        self.version: int = int(info["version"])
        self.stage: str = info["stage"]
        self.kind: str = info["kind"]
        self.framework: str = info.get("framework") or ""
        self.files: List[Dict[str, Any]] = list(info["files"])
        self.metrics: Dict[str, float] = dict(info.get("metrics") or {})
        self.metadata: Dict[str, Any] = dict(info.get("metadata") or {})
        self.tags: List[str] = list(info.get("tags") or [])
        self.task_id: int = int(info["task_id"])

    def __repr__(self) -> str:
        return f"<klique.Model {self.name} v{self.version} {self.stage}>"

    @classmethod
    def get(
        cls,
        name: str,
        version: Optional[int] = None,
        stage: Optional[str] = None,
        api: Optional[Api] = None,
    ) -> Model:
        """A version by number, or the one in `stage` (production, staging); the newest
        without either."""
        check_name(name)
        if version is not None and stage is not None:
            raise KliqueError("Model.get takes a version or a stage, not both")
        if stage is not None and stage not in ("production", "staging"):
            raise KliqueError(f"stage {stage!r}: Model.get takes production or staging")
        ref = str(int(version)) if version is not None else (stage or "latest")
        api = api or Api.here()
        return cls(api, api.get(f"/models/{urllib.parse.quote(name)}/versions/{ref}"))

    def get_local_copy(self) -> str:
        """A local copy, downloaded once into a private cache and checked by digest: the file,
        for a model of one file; else its folder."""
        folder = os.path.join(cache_dir(), "models", self.name, f"v{self.version}")
        for index, file in enumerate(self.files):
            parts = file["path"].split("/")
            if not all(PART.match(p) for p in parts):
                raise KliqueError(f"model {self.name}: file {file['path']!r} is not a plain path")
            dest = os.path.join(folder, *parts)
            if os.path.isfile(dest) and sha256_of(dest) == file["digest"]:
                continue
            self._fetch(index, dest, file["digest"])
        first = os.path.join(folder, *self.files[0]["path"].split("/"))
        return first if self.kind == "file" else folder

    def _fetch(self, index: int, dest: str, digest: str) -> None:
        where = f"/models/{urllib.parse.quote(self.name)}/versions/{self.version}/files/{index}"
        fetch_checked(self._api, where, dest, digest, f"model {self.name} version {self.version}")
