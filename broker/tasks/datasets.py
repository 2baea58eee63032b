"""Datasets' operations, one place for the REST API and the CLI behind it: ask which blobs a
caller still has to send, keep a sent blob, make an immutable version from a manifest, list and
show datasets, pick a version, and serve a version's files. Each asks broker/authz.py and raises
Klique's own errors; the manifest's rules are broker/datasets/manifest.py's."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from broker import authz
from broker.bounds import artifacts_problem
from broker.datasets.manifest import check_manifest, check_name, diff, new_bytes, total_bytes
from broker.errors import KliqueError, NotFound, NotPermitted
from broker.identity.resolve import Caller
from broker.store.datasets import DatasetStore
from broker.tasks.control import TaskControl
from broker.tasks.dataset_schemas import (
    MOST_READERS,
    DatasetDetailOut,
    DatasetManifestOut,
    DatasetOut,
    DatasetReadOut,
    DatasetVersionOut,
    DatasetVersionReadOut,
    VersionIn,
)


def no_such_dataset(name: str) -> NotFound:
    """The one answer for a dataset that does not exist and one the caller may not read."""
    return NotFound(f"no dataset {name!r} that you may read; `klique dataset ls` lists them")


def keeper_of(who: Caller) -> str:
    """Whose blobs a caller's uploads are: the team's, else the user's own."""
    return f"team:{who.team}" if who.team else f"user:{who.user}"


def version_out(found: dict[str, Any]) -> DatasetVersionOut:
    fields = {k: v for k, v in found.items() if k != "manifest"}
    return DatasetVersionOut(**fields, id=f"{found['name']}@{found['version']}")


def with_readers(found: dict[str, Any], tasks: list[int]) -> DatasetVersionReadOut:
    """A version with the tasks that read it (the first MOST_READERS ids, and how many)."""
    fields = version_out(found).model_dump()
    return DatasetVersionReadOut(**fields, reads=len(tasks), read_by=tasks[:MOST_READERS])


def check_sizes(manifest: dict[str, dict[str, Any]], known: dict[str, int]) -> None:
    """Each file's size is its content's, as sent: a manifest cannot misstate one."""
    for path, entry in manifest.items():
        if known.get(entry["digest"]) != entry["size"]:
            raise KliqueError(
                f"dataset file {path!r}: its size is {entry['size']} bytes, but its content "
                f"is {known.get(entry['digest'])} bytes"
            )


def pick(versions: list[dict[str, Any]], ref: str) -> dict[str, Any] | None:
    """The version `ref` names: a number, or `latest`."""
    if not versions:
        return None
    if ref == "latest":
        return versions[-1]
    return next((v for v in versions if v["version"] == int(ref)), None)


class DatasetService:
    """Datasets over one control loop (its store)."""

    def __init__(self, control: TaskControl) -> None:
        self.control = control
        self.store = DatasetStore(control.store)

    # Blobs

    def missing(self, actor: Caller, digests: Collection[str]) -> list[str]:
        """Of `digests`, those the caller's team (or the caller) has not sent: a version may
        name only those it sent, so content another team sent is sent again, never shared by
        knowing its digest."""
        authz.check_scope(actor, "submit")
        held = self.store.held(keeper_of(actor), digests)
        return sorted(set(digests) - held.keys())

    def room(self, actor: Caller) -> int | None:
        """Bytes a caller may still send: for a job's report token, what is left of its task's
        share (limits.max_artifacts, its artifacts and the blobs it sent together); None (no
        bound but the store's for one file) for a user."""
        authz.check_scope(actor, "submit")
        task = authz.speaks_for_task(actor)
        if task is None:
            return None
        artifacts = sum(a["size"] for a in self.control.store.artifacts(task))
        kept = artifacts + self.store.sent_by_task(task)
        return self.control.estate.limits.max_artifact_bytes - kept

    def over_room(self, actor: Caller, kept_left: int, size: int) -> str:
        """Why a job's blob of `size` bytes is refused, with `kept_left` bytes of room."""
        limits = self.control.estate.limits
        task = authz.speaks_for_task(actor) or 0
        return artifacts_problem(limits, task, limits.max_artifact_bytes - kept_left, size) or ""

    def sent(self, actor: Caller, named: str, digest: str, size: int) -> None:
        """A blob arrived whole: kept for the caller's keeper if it is what its name says."""
        if digest != named:
            raise KliqueError(
                f"the blob sent as {named} has SHA-256 {digest}; send each file under its own "
                "digest (the file changed while it was sent?)"
            )
        self.store.hold(keeper_of(actor), digest, size, authz.speaks_for_task(actor))

    # Versions

    def create(self, actor: Caller, name: str, body: VersionIn) -> DatasetVersionOut:
        """A new immutable version of `name` from its manifest. A run's report token makes it
        as the run's owner (as ClearML lets a task), into datasets that owner keeps only, and
        the version records the run."""
        authz.check_scope(actor, "submit")
        check_name(name)
        manifest = check_manifest({p: e.model_dump() for p, e in body.files.items()})
        parent: dict[str, Any] = {}
        if body.parent is not None:
            found = self.store.version(name, body.parent)
            if found is None or not self._readable(actor, self.store.dataset(name)):
                raise NotFound(f"dataset {name} has no version {body.parent} to derive from")
            parent = found["manifest"]
        change = diff(parent, manifest)
        held = self.store.held(keeper_of(actor), change.new_digests)
        unsent = change.new_digests - held.keys()
        if unsent:
            raise KliqueError(
                f"dataset {name}: {len(unsent)} files' content was never sent (one is "
                f"{sorted(unsent)[0]}); fix: send them first (the SDK's upload() does)"
            )
        check_sizes(manifest, {**{e["digest"]: e["size"] for e in parent.values()}, **held})
        owner = {"name": name, "owner": actor.user, "team": actor.team, "project": body.project}
        version = {
            "parent": body.parent,
            "manifest": manifest,
            "size": total_bytes(manifest),
            "new_size": new_bytes(manifest, change.new_digests),
            "created_by": actor.user,
            "task_id": authz.speaks_for_task(actor),
        }

        def kept_by_caller(dataset: dict[str, Any]) -> bool:
            return authz.writes_dataset(actor, dataset["owner"], dataset["team"])

        made = self.store.add_version(owner, version, kept_by_caller)
        if made is None:
            raise NotPermitted(
                f"dataset {name!r} is another team's; fix: make yours under another name"
            )
        return version_out(made)

    # Reading

    def listing(self, who: Caller) -> list[DatasetOut]:
        """The datasets the caller may read, by name, with their newest version's size."""
        readable = [d for d in self.store.datasets() if self._readable(who, d)]
        sizes = self.store.latest_sizes()  # read after: it holds every dataset read above
        return [
            DatasetOut(**d, files=sizes[d["name"]][0], size=sizes[d["name"]][1]) for d in readable
        ]

    def show(self, who: Caller, name: str) -> DatasetDetailOut:
        """A dataset and its versions (without their manifests), each with the tasks that read
        it."""
        dataset = self._visible(who, name)
        readers = self.store.readers(name)
        versions = [
            with_readers(v, readers.get(v["version"], [])) for v in self.store.versions(name)
        ]
        newest = versions[-1]
        return DatasetDetailOut(**dataset, files=newest.files, size=newest.size, versions=versions)

    def version(self, actor: Caller, name: str, ref: str) -> DatasetManifestOut:
        """A version with its manifest; read by a run's token, it goes on the run's record."""
        self._visible(actor, name)
        chosen = pick(self.store.versions(name), ref)
        found = chosen and self.store.version(name, chosen["version"])
        if not found:
            raise NotFound(f"dataset {name} has no version {ref}; `klique dataset show {name}`")
        task = authz.speaks_for_task(actor)
        if task is not None:
            self.store.record_read(task, name, found["version"])
        out = version_out(found).model_dump()
        return DatasetManifestOut(**out, manifest=found["manifest"])

    def blob(self, actor: Caller, name: str, number: int, digest: str) -> int:
        """The size of a file's content that version `number` of `name` holds, if the caller
        may read the dataset; NotFound for a digest that version does not name."""
        self._visible(actor, name)
        found = self.store.version(name, number)
        sizes = {e["digest"]: e["size"] for e in (found or {}).get("manifest", {}).values()}
        if digest not in sizes:
            raise NotFound(f"dataset {name} version {number} holds no file {digest}")
        return int(sizes[digest])

    def reads(self, task_id: int) -> list[DatasetReadOut]:
        return [DatasetReadOut(**r) for r in self.store.reads(task_id)]

    def _readable(self, who: Caller, dataset: dict[str, Any] | None) -> bool:
        return dataset is not None and authz.reads_dataset(who, dataset["owner"], dataset["team"])

    def _visible(self, who: Caller, name: str) -> dict[str, Any]:
        check_name(name)
        dataset = self.store.dataset(name)
        if dataset is None or not self._readable(who, dataset):
            raise no_such_dataset(name)
        return dataset
