"""Datasets from the SDK's side, in ClearML's names: a version is immutable and content-addressed
(each file by its SHA-256); a new one sends only the content the server lacks, and records its
parent. Inside a Klique job, get_local_copy() fetches a version once per node into the account's
cache on the pool's filesystem, under a lock, so concurrent tasks fetch it once.

    ds = klique.Dataset.create(dataset_name="images", dataset_project="vision")
    ds.add_files("data/")
    ds.upload()
    ds.finalize()                       # version 1, immutable
    path = klique.Dataset.get(dataset_name="images").get_local_copy()
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import stat
import tempfile
import urllib.parse

from klique._api import Api, KliqueError, job_document
from klique._names import PART, check_versioned_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Tuple

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
ASK_BATCH = 10_000  # digests asked about in one request


def check_name(name: str) -> str:
    return check_versioned_name("dataset", name)


def check_path(path: str) -> str:
    """A file's place in a version: relative, '/' between plain names (no '', '.', '..',
    hidden parts or absolute paths): joined to a folder, it never leaves it."""
    parts = path.split("/") if isinstance(path, str) else [""]
    if len(path) > 1024 or not all(PART.match(p) and p not in (".", "..") for p in parts):
        raise KliqueError(
            f"dataset file {path!r}: a relative path of plain names (letters, digits, . _ + - "
            "and spaces, no part starting with '.'), at most 1024 characters"
        )
    return path


def inside(root: str, path: str) -> str:
    """`path` of a manifest joined under `root`, checked: KliqueError for any path that would
    land elsewhere (../, absolute) or pass through a link."""
    check_path(path)
    joined = os.path.join(root, *path.split("/"))
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(joined)]) != real_root:
        raise KliqueError(f"dataset file {path!r} would leave its folder; it is not written")
    return joined


def sha256(path: str) -> Tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def walk(folder: str) -> List[Tuple[str, str]]:
    """(relative path, local path) of a folder's regular files; links and hidden names are
    left out (a version holds files of its folder only)."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and not os.path.islink(os.path.join(root, d))
        )
        for name in sorted(files):
            full = os.path.join(root, name)
            if name.startswith(".") or os.path.islink(full) or not os.path.isfile(full):
                continue
            found.append((os.path.relpath(full, folder).replace(os.sep, "/"), full))
    return found


def changed(parent: Dict[str, Dict[str, Any]], files: Dict[str, Dict[str, Any]]) -> List[str]:
    """The digests `files` names that `parent` does not: the only content a version sends."""
    known = {e["digest"] for e in parent.values()}
    return sorted({e["digest"] for e in files.values()} - known)


class Dataset:
    """A dataset version: a draft (Dataset.create, add_files, remove_files, upload, finalize)
    or a final one (Dataset.get); .id is NAME@VERSION once final."""

    def __init__(
        self,
        api: Api,
        name: str,
        project: str,
        files: Dict[str, Dict[str, Any]],
        parent: Optional[int] = None,
        info: Optional[Dict[str, Any]] = None,
    ) -> None:
        self._api = api
        self.name = check_name(name)
        self.project = project
        self.parent = parent
        self._files = files  # path -> {"digest", "size"}, and "source" for a local file
        self._parent_files = {p: dict(e) for p, e in files.items()} if info is None else {}
        self.info = info
        self.sent_bytes = 0  # content this object sent (upload())

    @property
    def version(self) -> Optional[int]:
        return int(self.info["version"]) if self.info else None

    @property
    def id(self) -> Optional[str]:
        return f"{self.name}@{self.version}" if self.info else None

    def __repr__(self) -> str:
        return f"<klique.Dataset {self.id or self.name + ' (draft)'} {len(self._files)} files>"

    # Making a version

    @classmethod
    def create(
        cls,
        dataset_name: str,
        dataset_project: Optional[str] = None,
        parent_datasets: Optional[Iterable[Any]] = None,
        api: Optional[Api] = None,
    ) -> Dataset:
        """A draft of the next version of `dataset_name`; with a parent (a Dataset, its id
        NAME@VERSION or a version number of the same dataset) it starts as that version."""
        check_name(dataset_name)
        api = api or Api.here()
        parents = list(parent_datasets or [])
        if len(parents) > 1:
            raise KliqueError("a dataset version has one parent; pass one in parent_datasets")
        if not parents:
            return cls(api, dataset_name, dataset_project or "default", {})
        parent = parents[0]
        if not isinstance(parent, Dataset):
            ref = str(parent)
            name, _, number = ref.rpartition("@") if "@" in ref else (dataset_name, "", ref)
            parent = cls.get(dataset_name=name, dataset_version=number, api=api)
        if parent.name != dataset_name or parent.version is None:
            raise KliqueError(
                f"the parent of a version of {dataset_name} is a final version of {dataset_name}"
            )
        files = {p: {"digest": e["digest"], "size": e["size"]} for p, e in parent._files.items()}
        return cls(api, dataset_name, dataset_project or parent.project, files, parent.version)

    def add_files(self, path: str, dataset_path: Optional[str] = None) -> int:
        """Add a file, or a folder's files (links and hidden names left out), under
        `dataset_path`; a file of the same path is replaced. Returns how many were added."""
        self._draft()
        path = os.fspath(path)
        if os.path.isfile(path):
            found = [(os.path.basename(path), path)]
        elif os.path.isdir(path):
            found = walk(path)
        else:
            raise KliqueError(f"{path} is neither a file nor a folder")
        prefix = (dataset_path or "").strip("/")
        for rel, local in found:
            where = check_path(f"{prefix}/{rel}" if prefix else rel)
            digest, size = sha256(local)
            self._files[where] = {"digest": digest, "size": size, "source": local}
        return len(found)

    def remove_files(self, dataset_path: str) -> int:
        """Remove the files whose path matches the pattern (fnmatch: `*.tmp`, `raw/*`)."""
        self._draft()
        gone = [p for p in self._files if fnmatch.fnmatchcase(p, dataset_path)]
        for p in gone:
            del self._files[p]
        return len(gone)

    def upload(self) -> int:
        """Send the content the server lacks (it is asked first); returns the bytes sent."""
        self._draft()
        new = changed(self._parent_files, self._files)
        missing: List[str] = []
        for start in range(0, len(new), ASK_BATCH):
            asked = {"digests": new[start : start + ASK_BATCH]}
            missing += self._api.post("/datasets/blobs/missing", asked)["missing"]
        sources = {e["digest"]: e.get("source") for e in self._files.values()}
        sent = 0
        for digest in missing:
            source = sources.get(digest)
            if not source:
                raise KliqueError(f"no local file holds {digest} to send; add it again")
            with open(source, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self._api.upload(f"/datasets/blobs/{digest}", f, size)
            sent += size
        self.sent_bytes += sent
        return sent

    def finalize(self) -> bool:
        """Make the version: immutable from here. Sends what upload() has not yet."""
        self._draft()
        self.upload()
        body = {
            "project": self.project,
            "parent": self.parent,
            "files": {
                p: {"digest": e["digest"], "size": e["size"]} for p, e in self._files.items()
            },
        }
        self.info = self._api.post(f"/datasets/{urllib.parse.quote(self.name)}/versions", body)
        self._files = {
            p: {"digest": e["digest"], "size": e["size"]} for p, e in self._files.items()
        }
        return True

    def _draft(self) -> None:
        if self.info is not None:
            raise KliqueError(
                f"dataset {self.id} is final; make the next version with "
                f"Dataset.create(dataset_name={self.name!r}, parent_datasets=[{self.id!r}])"
            )

    # Reading a version

    @classmethod
    def get(
        cls,
        dataset_name: Optional[str] = None,
        dataset_version: Optional[Any] = None,
        dataset_id: Optional[str] = None,
        dataset_project: Optional[str] = None,
        api: Optional[Api] = None,
    ) -> Dataset:
        """A final version: by id (NAME@VERSION), or by name and version (the newest without
        one). Read inside a job, the version goes on the task's record."""
        if dataset_id is not None:
            dataset_name, _, number = str(dataset_id).rpartition("@")
            dataset_version = number
        if dataset_name is None:
            raise KliqueError("Dataset.get takes dataset_name (and dataset_version) or dataset_id")
        check_name(dataset_name)
        ref = "latest" if dataset_version in (None, "", "latest") else str(int(dataset_version))
        api = api or Api.here()
        info = api.get(f"/datasets/{urllib.parse.quote(dataset_name)}/versions/{ref}")
        files = {p: {"digest": e["digest"], "size": e["size"]} for p, e in info["manifest"].items()}
        return cls(api, dataset_name, dataset_project or "default", files, info.get("parent"), info)

    def list_files(self, dataset_path: Optional[str] = None) -> List[str]:
        """The version's paths, sorted; those matching the pattern, with one."""
        return sorted(
            p for p in self._files if dataset_path is None or fnmatch.fnmatchcase(p, dataset_path)
        )

    def file_entries(self) -> Dict[str, Dict[str, Any]]:
        return {p: {"digest": e["digest"], "size": e["size"]} for p, e in self._files.items()}

    def get_local_copy(self) -> str:
        """The version's folder in the shared cache, fetched once per node (per cache): the
        first task takes the version's lock and fetches the files the cache lacks, by digest;
        the others wait on the lock and find the folder made. Its files are hard links to the
        cache's read-only blobs (copies where links cannot be made): do not write into it."""
        if self.info is None:
            raise KliqueError(f"dataset {self.name} is a draft; finalize() it first")
        cache = Cache(cache_root())
        return cache.version(self._api, self.name, int(self.info["version"]), self.file_entries())


def cache_root() -> str:
    """Inside a job, the runner's cache of the job's account (the pool's `cache_dir`, on the
    pool's filesystem; else ~/.cache/klique), as the runner makes it: private to the account;
    elsewhere ~/.cache/klique. Datasets go in its `datasets/` folder."""
    from inside_job.private import cache_root as runner_cache  # on its path only

    doc = job_document()
    configured = doc.get("cache_dir") if doc else None
    return os.path.join(
        runner_cache(configured if isinstance(configured, str) else None), "datasets"
    )


class Cache:
    """A dataset cache: `blobs/<2 hex>/<digest>` (read-only), `versions/<name>/v<N>/` (trees of
    links to them), `locks/<name>@<N>.lock`."""

    def __init__(self, root: str) -> None:
        self.root = root
        for sub in ("blobs", "versions", "locks"):
            os.makedirs(os.path.join(root, sub), mode=0o700, exist_ok=True)
        self.fetched = 0  # files this process downloaded

    def version(self, api: Api, name: str, number: int, files: Dict[str, Dict[str, Any]]) -> str:
        from inside_job.locks import FileLock  # on its path only: every task imports klique

        check_name(name)
        final = os.path.join(self.root, "versions", name, f"v{int(number)}")
        if _made(final):
            return final
        with FileLock(os.path.join(self.root, "locks", f"{name}@{int(number)}.lock")):
            if _made(final):
                return final
            for path, entry in sorted(files.items()):
                check_path(path)
                self._blob(api, name, number, entry)
            for planted in (os.path.dirname(final), final):  # a link there is never followed
                if os.path.islink(planted):
                    os.unlink(planted)
            os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
            partial = tempfile.mkdtemp(dir=os.path.dirname(final), prefix=f".v{int(number)}-")
            try:
                for path, entry in files.items():
                    dest = inside(partial, path)
                    os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
                    _link(self._blob_path(entry["digest"]), dest)
                os.rename(partial, final)
            finally:
                if os.path.isdir(partial):
                    shutil.rmtree(partial, ignore_errors=True)
        return final

    def _blob_path(self, digest: str) -> str:
        if not _DIGEST.match(digest):
            raise KliqueError(f"{digest!r} is not a SHA-256 digest")
        return os.path.join(self.root, "blobs", digest[:2], digest)

    def _blob(self, api: Api, name: str, number: int, entry: Dict[str, Any]) -> None:
        """The blob in the cache, downloaded and checked if missing."""
        digest = entry["digest"]
        blob = self._blob_path(digest)
        try:
            found = os.lstat(blob)
            if stat.S_ISREG(found.st_mode) and found.st_size == entry["size"]:
                return
            os.unlink(blob)  # a link or a wrong size: never trusted, fetched again
        except FileNotFoundError:
            pass
        os.makedirs(os.path.dirname(blob), mode=0o700, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=os.path.dirname(blob), prefix=".partial-")
        path = f"/datasets/{urllib.parse.quote(name)}/versions/{int(number)}/blobs/{digest}"
        try:
            with os.fdopen(fd, "wb") as out:
                api.download(path, out)
            if sha256(partial)[0] != digest:
                raise KliqueError(f"dataset {name} version {number}: {digest} arrived damaged")
            os.chmod(partial, 0o400)  # shared by hard links: a task writing one would spoil all
            os.replace(partial, blob)
            self.fetched += 1
        finally:
            if os.path.exists(partial):
                os.unlink(partial)


def _made(folder: str) -> bool:
    """A version's folder exists as a folder of its own (a link there is never followed)."""
    try:
        return stat.S_ISDIR(os.lstat(folder).st_mode)
    except FileNotFoundError:
        return False


def _link(blob: str, dest: str) -> None:
    try:
        os.link(blob, dest)
    except OSError:  # another filesystem, or links refused: a copy
        shutil.copyfile(blob, dest)
        os.chmod(dest, 0o400)
