"""Artifacts from the SDK's side: files and pickled objects, uploaded as a stream and
downloaded into a private cache checked against their SHA-256."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import tempfile
import urllib.parse
import zipfile

from inside_job.digests import sha256_of
from klique._api import KliqueError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterator, List

    from klique._api import Api

PICKLE_PROTOCOL = 4  # readable by every Python from 3.4, so by any job's interpreter
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._ +-]")


class File:
    """A file a pipeline step returns: it passes to the next step as a file, whose local path
    the consuming step receives."""

    def __init__(self, path: str) -> None:
        self.path = os.fspath(path)

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"klique.File({self.path!r})"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise KliqueError(
            f"artifact name {name!r}: use letters, digits, '.', '_' and '-' (at most 128), "
            "starting with a letter or digit"
        )
    return name


def upload(
    api: Api, task_id: int, name: str, artifact: Any, as_object: bool = False
) -> Dict[str, Any]:
    """A File, an existing file's path, a folder's path (sent as a zip), or else (or with
    as_object) any object, pickled: a dict, a pandas DataFrame, a numpy array..."""
    check_name(name)
    path = None
    names_a_folder = isinstance(artifact, (str, os.PathLike)) and os.path.isdir(os.fspath(artifact))
    if not as_object and names_a_folder:
        return _send_folder(api, task_id, name, os.fspath(artifact))
    names_a_file = isinstance(artifact, (str, os.PathLike)) and os.path.isfile(os.fspath(artifact))
    if not as_object and (isinstance(artifact, File) or names_a_file):
        path = os.fspath(artifact)
        if not os.path.isfile(path):
            raise KliqueError(f"{path} is not a file; an artifact is a file or an object")
    if path is not None:
        return _send(api, task_id, name, "file", path, os.path.basename(path))
    with tempfile.TemporaryDirectory(prefix="klique-pickle-") as scratch:
        pickled = os.path.join(scratch, "object.pkl")
        with open(pickled, "wb") as f:
            pickle.dump(artifact, f, protocol=PICKLE_PROTOCOL)
        return _send(api, task_id, name, "object", pickled, name + ".pkl")


def _send_folder(api: Api, task_id: int, name: str, folder: str) -> Dict[str, Any]:
    """A folder and everything under it, as one zip (its paths relative to the folder)."""
    base = os.path.basename(os.path.normpath(folder)) or name
    with tempfile.TemporaryDirectory(prefix="klique-folder-") as scratch:
        archive = shutil.make_archive(os.path.join(scratch, base), "zip", folder)
        return _send(api, task_id, name, "folder", archive, base + ".zip")


def _send(api: Api, task_id: int, name: str, kind: str, path: str, filename: str) -> Dict[str, Any]:
    filename = _UNSAFE.sub("_", filename).lstrip(".") or name
    query = urllib.parse.urlencode({"kind": kind, "filename": filename[:255]})
    with open(path, "rb") as source:
        size = os.fstat(source.fileno()).st_size
        result: Dict[str, Any] = api.upload(
            f"/tasks/{int(task_id)}/artifacts/{name}?{query}", source, size
        )
    return result


class Artifact:
    """One artifact of a task: .get() gives the object (or a file's local path), .local_copy()
    the path of a local copy."""

    def __init__(self, api: Api, task_id: int, info: Dict[str, Any]) -> None:
        self._api = api
        self.task_id = task_id
        self.name: str = info["name"]
        self.kind: str = info["kind"]
        self.filename: str = info["filename"]
        self.digest: str = info["digest"]
        self.size: int = info["size"]

    def __repr__(self) -> str:
        return f"<klique.Artifact {self.task_id}/{self.name} {self.kind} {self.size} bytes>"

    def local_copy(self) -> str:
        """A local copy, downloaded once into a private cache and checked by its digest."""
        folder = os.path.join(cache_dir(), self.digest)
        path = os.path.join(folder, os.path.basename(self.filename) or self.name)
        if os.path.isfile(path) and sha256_of(path) == self.digest:
            return path
        where = f"/tasks/{self.task_id}/artifacts/{self.name}"
        fetch_checked(
            self._api, where, path, self.digest, f"artifact {self.name} of task {self.task_id}"
        )
        return path

    @property
    def metadata(self) -> Dict[str, Any]:
        """What upload_artifact(metadata=) kept (the task's parameter artifact_metadata/NAME)."""
        record = self._api.get(f"/sdk/tasks/{self.task_id}")
        found: Dict[str, Any] = (record.get("parameters") or {}).get(
            f"artifact_metadata/{self.name}"
        ) or {}
        return found

    def get_local_copy(self) -> str:
        """ClearML's name: the path of a local copy (a folder's, unpacked)."""
        path = self.local_copy()
        return _unpacked(path) if self.kind == "folder" else path

    def get(self) -> Any:
        """The object (unpickled), or for a file the path of its local copy, for a folder the
        path of its unpacked copy. Unpickling runs code: read only your own tasks' artifacts
        (the server lets no one else's through)."""
        path = self.local_copy()
        if self.kind == "folder":
            return _unpacked(path)
        if self.kind != "object":
            return path
        with open(path, "rb") as f:
            return pickle.load(f)  # noqa: S301 (the caller's own task's artifact)


class Artifacts:
    """task.artifacts["model"]: a task's artifacts by name."""

    def __init__(self, api: Api, task_id: int) -> None:
        self._api = api
        self.task_id = task_id
        self._found: List[Dict[str, Any]] = api.get(f"/tasks/{task_id}/artifacts")

    def __getitem__(self, name: str) -> Artifact:
        for info in self._found:
            if info["name"] == name:
                return Artifact(self._api, self.task_id, info)
        names = ", ".join(i["name"] for i in self._found) or "none"
        raise KeyError(f"task {self.task_id} has no artifact {name!r} (it has: {names})")

    def __contains__(self, name: object) -> bool:
        return any(i["name"] == name for i in self._found)

    def __iter__(self) -> Iterator[str]:
        return iter([i["name"] for i in self._found])

    def __len__(self) -> int:
        return len(self._found)

    def keys(self) -> List[str]:
        return list(self)


def cache_dir() -> str:
    """Private to this account: inside a job, the job's own folder; else ~/.cache/klique."""
    job_dir = os.environ.get("KLIQUE_JOB_DIR")
    if job_dir:
        return os.path.join(job_dir, "artifacts")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "klique", "artifacts")


def fetch_checked(api: Api, where: str, dest: str, digest: str, what: str) -> None:
    """Download `where` to `dest` through a partial file beside it, moved into place only when
    its SHA-256 is `digest`: a copy cut short or damaged never stands at `dest`. `what` names
    the file in the error (`artifact NAME of task 7`)."""
    os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".partial-")
    try:
        with os.fdopen(fd, "wb") as out:
            api.download(where, out)
        if sha256_of(partial) != digest:
            raise KliqueError(f"{what} arrived damaged")
        os.replace(partial, dest)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def _unpacked(archive: str) -> str:
    """A folder artifact's zip, unpacked once beside it (the zip is checked by its digest;
    zipfile keeps every member inside the folder it extracts to)."""
    folder = os.path.join(os.path.dirname(archive), "unpacked")
    if not os.path.isdir(folder):
        partial = tempfile.mkdtemp(dir=os.path.dirname(archive), prefix=".unpacking-")
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(partial)
        try:
            os.rename(partial, folder)
        except OSError:  # another process unpacked it first
            shutil.rmtree(partial, ignore_errors=True)
    return folder
