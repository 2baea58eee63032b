"""The artifact store: content-addressed files, kept by the control plane under
`$KLIQUE_HOME/artifacts` or at any fsspec URL the estate names (a shared filesystem path, an
S3-compatible bucket). A file's place is `sha256/<2 hex>/<64 hex>` of its content: names that
users give never become paths, and identical outputs are kept once."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import BinaryIO

import fsspec

from broker.errors import TooLarge  # an upload past the estate's artifacts.max_size

CHUNK = 1 << 20


class ArtifactStore:
    def __init__(self, url: str | None, home: Path, max_bytes: int) -> None:
        if url is None:
            folder = home / "artifacts"
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            url = str(folder)
        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.fs.makedirs(f"{self.root}/tmp", exist_ok=True)
        self.max_bytes = max_bytes

    def path(self, digest: str) -> str:
        return f"{self.root}/sha256/{digest[:2]}/{digest}"

    async def put(self, chunks: AsyncIterator[bytes]) -> tuple[str, int]:
        """Store a stream; returns (digest, size). TooLarge past max_bytes (nothing is kept)."""
        partial = f"{self.root}/tmp/{secrets.token_hex(16)}"
        digest = hashlib.sha256()
        size = 0
        try:
            with self.fs.open(partial, "wb") as out:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise TooLarge(too_large(size, self.max_bytes, at_least=True))
                    digest.update(chunk)
                    out.write(chunk)
            final = self.path(digest.hexdigest())
            if self.fs.exists(final):
                self.fs.rm(partial)
            else:
                self.fs.makedirs(final.rsplit("/", 1)[0], exist_ok=True)
                self.fs.mv(partial, final)
        except BaseException:
            if self.fs.exists(partial):
                self.fs.rm(partial)
            raise
        return digest.hexdigest(), size

    def read(self, digest: str) -> Iterator[bytes]:
        """The content of `digest`, a chunk at a time."""
        handle: BinaryIO
        with self.fs.open(self.path(digest), "rb") as handle:
            while chunk := handle.read(CHUNK):
                yield chunk

    def exists(self, digest: str) -> bool:
        return bool(self.fs.exists(self.path(digest)))

    def remove(self, digest: str) -> None:
        """Forget the content of `digest` (nothing refers to it any more); gone already: done."""
        if self.fs.exists(self.path(digest)):
            self.fs.rm(self.path(digest))


def too_large(size: int, limit: int, at_least: bool = False) -> str:
    return (
        f"the artifact is {'over ' if at_least else ''}{size} bytes, over this server's limit of "
        f"{limit} bytes; fix: keep large data on the shared filesystem and pass its path, or "
        "ask the platform team to raise artifacts.max_size in the estate"
    )
