"""Where a dataset's bytes live: one object per SHA-256 digest. By default the server's
artifact store (its folder or fsspec URL, its size limit, its streaming: broker/artifacts.py);
where the estate names one (`datasets: {store: s3, ...}`), an S3-compatible bucket through
boto3. Both keep a blob at `sha256/<2 hex>/<64 hex>`: names that users give never become keys."""

from __future__ import annotations

import configparser
import hashlib
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Protocol

from broker.artifacts import CHUNK, ArtifactStore, too_large
from broker.domain import DatasetSettings
from broker.errors import KliqueError, TooLarge

SPOOL_BYTES = 8 << 20  # a blob past this spools to disk before it goes to the bucket


class Blobs(Protocol):
    """A content-addressed store: put a stream (its digest and size back), read one, ask."""

    max_bytes: int

    async def put(self, chunks: AsyncIterator[bytes]) -> tuple[str, int]: ...

    def read(self, digest: str) -> Iterator[bytes]: ...

    def exists(self, digest: str) -> bool: ...


def key_of(digest: str) -> str:
    return f"sha256/{digest[:2]}/{digest}"


class S3Blobs:
    """Blobs in an S3-compatible bucket (AWS, MinIO, Ceph RGW...), credentials from a file the
    estate names (the AWS credentials format: `[default]` with aws_access_key_id and
    aws_secret_access_key), so no secret sits in the estate itself."""

    def __init__(self, settings: DatasetSettings, max_bytes: int) -> None:
        import boto3  # the server extra's; only a server with an S3 dataset store loads it

        key_id, secret = read_credentials(settings.credentials_file)
        self.bucket = settings.bucket or ""
        self.client = boto3.client(
            "s3",
            endpoint_url=settings.endpoint,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            region_name=settings.region,
        )
        self.max_bytes = max_bytes

    async def put(self, chunks: AsyncIterator[bytes]) -> tuple[str, int]:
        """Hash the stream while it spools, then send it once under its digest's key (an S3
        object appears whole or not at all). TooLarge past max_bytes; nothing is kept."""
        digest = hashlib.sha256()
        size = 0
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
            async for chunk in chunks:
                size += len(chunk)
                if size > self.max_bytes:
                    raise TooLarge(too_large(size, self.max_bytes, at_least=True))
                digest.update(chunk)
                spool.write(chunk)
            spool.seek(0)
            if not self.exists(digest.hexdigest()):
                self.client.upload_fileobj(spool, self.bucket, key_of(digest.hexdigest()))
        return digest.hexdigest(), size

    def read(self, digest: str) -> Iterator[bytes]:
        body = self.client.get_object(Bucket=self.bucket, Key=key_of(digest))["Body"]
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()

    def exists(self, digest: str) -> bool:
        found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=key_of(digest), MaxKeys=1)
        return int(found.get("KeyCount", 0)) > 0


def read_credentials(path: str | None) -> tuple[str | None, str | None]:
    """(key id, secret) from an AWS-style credentials file; (None, None) without one (boto3
    then finds its own: the environment, an instance role)."""
    if path is None:
        return None, None
    parser = configparser.ConfigParser()
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
        section = parser["default"]
        return section["aws_access_key_id"], section["aws_secret_access_key"]
    except (OSError, KeyError, configparser.Error) as exc:
        raise KliqueError(
            f"datasets.credentials_file {path}: cannot read a [default] section with "
            f"aws_access_key_id and aws_secret_access_key ({exc})"
        ) from None


def blobs_for(settings: DatasetSettings, artifacts: ArtifactStore) -> Blobs:
    """The estate's choice: the artifact store itself, or its S3 bucket."""
    if settings.store == "s3":
        return S3Blobs(settings, artifacts.max_bytes)
    return artifacts
