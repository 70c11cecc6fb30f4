"""The blob store: one small interface, two implementations (a local folder, S3).

Keys are `/`-separated relative paths (`avatars/<id>/meta.json`, `jobs/<id>/segments/00003.mp4`,
`outputs/<id>.mp4`). Every write is atomic: no reader ever sees a partial object under its final
name (a temporary name + rename on a folder; S3's PUT is atomic by itself). Objects are immutable
once written, except that `put` replaces.

Raises services.serving.errors.NotFound for a missing key and StoreUnavailable when the backend
cannot be reached. Every method is synchronous and thread-safe; asyncio callers use
`asyncio.to_thread`.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from pathlib import Path


class BlobStore(abc.ABC):
    url: str

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file (streamed, not read into memory at once)."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def get_file(self, key: str, path: Path) -> None:
        """Download to a local file, atomically (streamed)."""

    @abc.abstractmethod
    def read_chunks(self, key: str, chunk_bytes: int) -> Iterator[bytes]:
        """The object's bytes in pieces of at most `chunk_bytes` (DownloadOutput streams these)."""

    @abc.abstractmethod
    def size(self, key: str) -> int: ...

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove one object; a missing key is not an error."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Remove every object whose key starts with `prefix`; returns how many."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys starting with `prefix`, sorted."""

    def close(self) -> None:
        """Release connections."""


def open_blob_store(url: str) -> BlobStore:
    """`file:///abs/folder`, a plain folder path, or `s3://bucket/optional/prefix` (credentials,
    region and endpoint from the standard AWS_* environment variables, e.g. AWS_ENDPOINT_URL)."""
    if url.startswith("s3://"):
        from services.jobs.store.s3 import S3BlobStore

        return S3BlobStore(url)
    from services.jobs.store.folder import FolderBlobStore

    return FolderBlobStore(url)
