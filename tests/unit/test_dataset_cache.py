"""The SDK's dataset cache: processes that need one version at once fetch each file once (the
version's lock), later versions fetch only what changed, and a version's folder is links to
read-only blobs."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from klique._api import KliqueError
from klique.datasets import Cache

CONTENT = {f"part/{i}.txt": f"row {i}\n".encode() * 50 for i in range(12)}


def manifest(files: dict[str, bytes]) -> dict[str, dict[str, Any]]:
    return {p: {"digest": hashlib.sha256(c).hexdigest(), "size": len(c)} for p, c in files.items()}


class CountingApi:
    """Serves blobs by digest and appends one line per download to a file (shared by
    processes)."""

    def __init__(self, files: dict[str, bytes], log: Path) -> None:
        self.by_digest = {hashlib.sha256(c).hexdigest(): c for c in files.values()}
        self.log = log

    def download(self, path: str, dest: Any) -> None:
        digest = path.rsplit("/", 1)[1]
        with open(self.log, "a") as f:
            f.write(digest + "\n")
        dest.write(self.by_digest[digest])


def read_version(root: str, log: str, start: Any, number: int) -> None:
    start.wait()
    files = dict(CONTENT)
    Cache(root).version(CountingApi(files, Path(log)), "d", number, manifest(files))


def test_processes_reading_one_version_at_once_fetch_each_file_once(tmp_path):
    log = tmp_path / "downloads"
    log.touch()
    context = multiprocessing.get_context("fork")
    start = context.Event()
    readers = [
        context.Process(target=read_version, args=(str(tmp_path / "c"), str(log), start, 1))
        for _ in range(4)
    ]
    for reader in readers:
        reader.start()
    start.set()
    for reader in readers:
        reader.join(60)
        assert reader.exitcode == 0
    assert len(log.read_text().split()) == len(CONTENT)
    folder = tmp_path / "c" / "versions" / "d" / "v1"
    for path, content in CONTENT.items():
        assert (folder / path).read_bytes() == content


def test_a_later_version_fetches_only_what_changed_and_links_read_only_blobs(tmp_path):
    log = tmp_path / "downloads"
    cache = Cache(str(tmp_path / "c"))
    cache.version(CountingApi(CONTENT, log), "d", 1, manifest(CONTENT))
    changed = {**CONTENT, "part/0.txt": b"edited"}
    folder = cache.version(CountingApi(changed, log), "d", 2, manifest(changed))
    assert len(log.read_text().split()) == len(CONTENT) + 1
    linked = Path(folder) / "part" / "1.txt"
    assert os.stat(linked).st_nlink >= 3  # the blob, and both versions' trees
    assert not os.stat(linked).st_mode & 0o222
    assert (Path(folder) / "part" / "0.txt").read_bytes() == b"edited"


def test_a_blob_that_arrives_damaged_is_not_kept(tmp_path):
    cache = Cache(str(tmp_path / "c"))
    api = CountingApi(CONTENT, tmp_path / "downloads")
    wrong = manifest(CONTENT)
    wrong["part/0.txt"] = {"digest": hashlib.sha256(b"other").hexdigest(), "size": 5}
    api.by_digest[wrong["part/0.txt"]["digest"]] = b"other but not"
    with pytest.raises(KliqueError, match="arrived damaged"):
        cache.version(api, "d", 1, wrong)
    assert not (tmp_path / "c" / "versions" / "d" / "v1").exists()
