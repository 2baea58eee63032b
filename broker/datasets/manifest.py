"""A dataset version's manifest and the rules over it, as plain functions over plain data
(table-tested in tests/unit/test_dataset_manifest.py). A manifest maps a file's path inside
the version to its content's SHA-256 and size: it is the version's whole record, and the bytes
are kept once per digest, whichever versions name them."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.errors import KliqueError
from broker.names import FILENAME

# A dataset's name is a name, never a path (as a task's or a model's).
DATASET_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
DIGEST = r"^[0-9a-f]{64}$"
MOST_FILES = 1_000_000
MOST_PATH = 1024
_COMPONENT = re.compile(FILENAME)
_DIGEST = re.compile(DIGEST)

Manifest = dict[str, dict[str, Any]]  # path -> {"digest": 64 hex, "size": bytes}


@dataclass(frozen=True)
class Change:
    """How a version differs from its parent: paths added, changed and removed, and the
    digests it names that its parent does not (the only content a new version may send)."""

    added: tuple[str, ...]
    changed: tuple[str, ...]
    removed: tuple[str, ...]
    new_digests: frozenset[str]


def check_name(name: str) -> str:
    """A dataset name as the server keeps it; KliqueError with the rule otherwise."""
    if not isinstance(name, str) or not re.fullmatch(DATASET_NAME, name) or ".." in name:
        raise KliqueError(
            f"dataset name {name!r}: use letters, digits, '.', '_' and '-' (at most 128), "
            "starting with a letter or digit, never '..'"
        )
    return name


def check_path(path: str) -> str:
    """A file's place inside a version: relative, '/' between parts, each part a plain file
    name (no '', '.', '..' or hidden parts), so a local copy can never leave its folder."""
    parts = path.split("/") if isinstance(path, str) else [""]
    if len(path) > MOST_PATH or not all(_COMPONENT.fullmatch(part) for part in parts):
        raise KliqueError(
            f"dataset file {path!r}: a relative path of plain names (letters, digits, . _ + - "
            f"and spaces, no part starting with '.'), at most {MOST_PATH} characters"
        )
    return path


def check_manifest(raw: Mapping[str, Any]) -> Manifest:
    """A manifest as the server keeps it, each entry checked; KliqueError naming the first
    bad one. Paths that would be a file and a folder at once are refused too."""
    if len(raw) > MOST_FILES:
        raise KliqueError(f"a dataset version holds at most {MOST_FILES} files, not {len(raw)}")
    out: Manifest = {}
    for path, entry in raw.items():
        check_path(path)
        digest = entry.get("digest") if isinstance(entry, Mapping) else None
        size = entry.get("size") if isinstance(entry, Mapping) else None
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise KliqueError(f"dataset file {path!r}: its digest is not 64 lowercase hex")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise KliqueError(f"dataset file {path!r}: its size is not a whole number of bytes")
        out[path] = {"digest": digest, "size": size}
    folders = {"/".join(p.split("/")[:i]) for p in out for i in range(1, p.count("/") + 1)}
    clash = sorted(folders & out.keys())
    if clash:
        raise KliqueError(f"dataset file {clash[0]!r} is also a folder of another file")
    return out


def diff(parent: Mapping[str, Mapping[str, Any]], child: Mapping[str, Mapping[str, Any]]) -> Change:
    """What `child` changes relative to `parent` (an empty parent for a first version)."""
    added = sorted(p for p in child if p not in parent)
    removed = sorted(p for p in parent if p not in child)
    changed = sorted(p for p in child if p in parent and child[p]["digest"] != parent[p]["digest"])
    known = {e["digest"] for e in parent.values()}
    new = frozenset(e["digest"] for e in child.values()) - known
    return Change(tuple(added), tuple(changed), tuple(removed), new)


def apply(
    parent: Mapping[str, Mapping[str, Any]],
    put: Mapping[str, Mapping[str, Any]],
    removed: Iterable[str] = (),
) -> Manifest:
    """The parent's manifest with `put` added or replaced and `removed` taken out."""
    gone = set(removed)
    out = {p: dict(e) for p, e in parent.items() if p not in gone}
    out.update({p: dict(e) for p, e in put.items()})
    return out


def total_bytes(manifest: Mapping[str, Mapping[str, Any]]) -> int:
    return sum(int(e["size"]) for e in manifest.values())


def new_bytes(manifest: Mapping[str, Mapping[str, Any]], digests: Iterable[str]) -> int:
    """Bytes of the files whose digest is in `digests`, each digest counted once."""
    wanted = set(digests)
    sizes = {e["digest"]: int(e["size"]) for e in manifest.values() if e["digest"] in wanted}
    return sum(sizes.values())
