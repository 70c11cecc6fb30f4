"""The blob store: one small interface, two implementations (a local folder, S3).

Keys are `/`-separated relative paths (`avatars/<id>/meta.json`, `jobs/<id>/segments/00003.mp4`,
`outputs/<id>.mp4`). Every write is atomic: no reader ever sees a partial object under its final
name (a temporary name + rename on a folder; S3's PUT is atomic by itself). Objects are immutable
once written, except that `put` replaces.

Raises services.serving.errors.NotFound for a missing key and StoreUnavailable when the backend
cannot be reached. Every method is synchronous and thread-safe; asyncio callers use
`asyncio.to_thread`.

This module is the interface and imports no implementation (the factory, `open_blob_store`, is in
the package's `__init__`). What both implementations share lives here too: the key rules
(`check_key`, `check_prefix`) and the temporary name of a local write (`atomic_write`, `TEMP_NAME`),
so that a key that works on a folder works on S3.
"""

from __future__ import annotations

import abc
import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

#: the name of a write in progress, `.<name>.<uuid4 hex>.tmp` (atomic_write): never listed, refused as a key
TEMP_NAME = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp$")


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

    @abc.abstractmethod
    def modified_times(self, prefix: str) -> dict[str, float]:
        """Each key starting with `prefix` and when it was last written (Unix seconds, the store's
        clock): the janitor deletes files no row refers to only once nobody has written them for a while."""

    def presigned_url(self, key: str, expires_s: float) -> str | None:
        """A URL a plain HTTP GET reads the object from for `expires_s` seconds without credentials,
        or None where the store has no such URLs (a folder). Signing is local: the key is not read."""
        return None

    def close(self) -> None:
        """Release connections."""


def check_key(key: str) -> str:
    """A key is a relative `/`-separated path: not empty, no empty, `.` or `..` segment, no backslash
    or NUL, and its last segment not a temporary file's name. Raises ValueError otherwise.

    Both implementations check keys the same way, so a key that works on a folder works on S3."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"invalid blob key {key!r}: empty")
    if "\\" in key or "\0" in key:
        raise ValueError(f"invalid blob key {key!r}: backslashes and NUL are not allowed")
    if key.startswith("/"):
        raise ValueError(f"invalid blob key {key!r}: must be relative")
    segments = key.split("/")
    if any(s in ("", ".", "..") for s in segments):
        raise ValueError(f"invalid blob key {key!r}: empty, '.' and '..' segments are not allowed")
    if TEMP_NAME.match(segments[-1]):
        raise ValueError(f"invalid blob key {key!r}: the name is reserved for temporary files")
    return key


def check_prefix(prefix: str) -> str:
    """A prefix is "" (every key) or the start of a key: the rules of `check_key`, except that it may
    end with `/` or in the middle of a segment (`jobs/12` matches `jobs/123/...`)."""
    if not isinstance(prefix, str):
        raise ValueError(f"invalid blob prefix {prefix!r}: not a string")
    if not prefix:
        return prefix
    if "\\" in prefix or "\0" in prefix:
        raise ValueError(f"invalid blob prefix {prefix!r}: backslashes and NUL are not allowed")
    if prefix.startswith("/"):
        raise ValueError(f"invalid blob prefix {prefix!r}: must be relative")
    segments = prefix.split("/")
    complete, last = segments[:-1], segments[-1]  # the last segment may be partial ("" after a "/")
    if any(s in ("", ".", "..") for s in complete) or last == "..":
        raise ValueError(f"invalid blob prefix {prefix!r}: empty, '.' and '..' segments are not allowed")
    return prefix


def atomic_write(final: Path, fill: Callable[[BinaryIO], object]) -> None:
    """Write through `fill` into a fresh temporary file next to `final`, flush it to disk, then rename
    it over `final`. On any failure the temporary file is removed and `final` is untouched."""
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
