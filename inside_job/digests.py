"""A file's SHA-256, read a chunk at a time: how the runner and the SDK check a download against
the digest the server gave before keeping it. Standard library only (the SDK imports it too)."""

from __future__ import annotations

import hashlib

CHUNK = 1 << 20


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
