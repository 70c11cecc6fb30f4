"""The blob store on a local folder (one machine, or a ReadWriteMany volume shared by every pod).

Each key is a file under the root (`avatars/<id>/meta.json` -> `<root>/avatars/<id>/meta.json`).
A write goes to a temporary file in the destination folder (`.<name>.<32 hex>.tmp`, a unique name
per write, so concurrent writers on any host never share one) and is renamed over the final name
with `os.replace`, which is atomic on one filesystem: a reader sees the old object, the new one or
none, never a partial one. Temporary files are never listed and their names are refused as keys.

Thread-safe without locks: every operation is a self-contained filesystem call sequence, and the
one race between writers and `delete`/`delete_prefix` (a writer's folder removed as empty between
its `mkdir` and its write, or in the middle of the `mkdir`) is retried.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from services.jobs.store.blobs import TEMP_NAME, BlobStore, atomic_write, check_key, check_prefix
from services.serving.errors import NotFound, StorageFull, StoreUnavailable

_COPY_BUFFER = 1024 * 1024
_WRITE_ATTEMPTS = 5  # a concurrent delete_prefix may remove a just-made empty folder; try again
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
_READ_ONLY = frozenset({errno.EROFS})
_REFUSED = frozenset({errno.EACCES, errno.EPERM})
_UNREACHABLE = frozenset(
    {errno.EIO, errno.ENOTCONN, errno.ESTALE, errno.ETIMEDOUT, errno.EHOSTDOWN, errno.ENXIO, errno.ENODEV}
)


def storage_error(url: str, exc: OSError, write: bool) -> StorageFull | StoreUnavailable | None:
    """What a filesystem error of the blob store means to a caller, or None when it is not the
    storage's fault (e.g. a bad key). Why: a full or read-only volume is an operator's problem that
    passes, so the client gets RESOURCE_EXHAUSTED or UNAVAILABLE naming the store and what to do,
    and render workers retry, instead of an INTERNAL that fails the job."""
    reason = exc.strerror or type(exc).__name__
    if exc.errno in _FULL:
        return StorageFull(f"the blob store {url} is full ({reason}); free space or grow the volume, then retry")
    if exc.errno in _READ_ONLY:
        return StoreUnavailable(f"the blob store {url} is read-only ({reason}); mount it read-write, then retry")
    if write and exc.errno in _REFUSED:
        return StoreUnavailable(
            f"the blob store {url} refuses writes ({reason}); check the volume's permissions and mount, then retry"
        )
    if exc.errno in _UNREACHABLE:
        return StoreUnavailable(f"the blob store {url} cannot be reached ({reason}); check the volume, then retry")
    return None


@contextlib.contextmanager
def mapped_errors(url: str, write: bool) -> Iterator[None]:
    """Raise storage_error's StorageFull/StoreUnavailable for an OSError that has one."""
    try:
        yield
    except OSError as exc:
        mapped = storage_error(url, exc, write)
        if mapped is None:
            raise
        raise mapped from exc


def folder_from_url(url: str) -> Path:
    """`file:///abs/folder` or a plain path (relative to the working directory) -> an absolute Path."""
    if url.startswith("file:"):
        parts = urllib.parse.urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"blob store url {url!r}: a file: url names a local folder (file:///abs/path)")
        path = urllib.request.url2pathname(parts.path)
    else:
        path = url
    if not path:
        raise ValueError(f"blob store url {url!r}: no folder")
    return Path(path).expanduser().absolute()


class FolderBlobStore(BlobStore):
    """Blobs as files under one folder (created if missing)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.root = folder_from_url(url)
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"FolderBlobStore({self.url!r})"

    # -- writes -----------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        view = memoryview(data)
        self._write(key, lambda f: f.write(view))

    def put_file(self, key: str, path: Path) -> None:
        with open(path, "rb") as src:  # a missing source is the caller's FileNotFoundError, not NotFound
            started = False

            def copy(dst: BinaryIO) -> None:
                nonlocal started
                if started:
                    src.seek(0)  # a retried attempt starts over (only then: the source may be a pipe)
                started = True
                shutil.copyfileobj(src, dst, _COPY_BUFFER)

            self._write(key, copy)

    def _write(self, key: str, fill: Callable[[BinaryIO], object]) -> None:
        final = self._path(key)
        for attempt in range(_WRITE_ATTEMPTS):
            try:
                with mapped_errors(self.url, write=True):
                    try:
                        _make_folder(final.parent)
                        atomic_write(final, fill)  # removes its temporary file on any failure
                    except OSError as exc:
                        if storage_error(self.url, exc, write=True) is not None:
                            self._remove_empty_folders({final.parent})  # leave no empty folder behind
                        raise
                return
            except FileNotFoundError:
                # The folder vanished under us (a concurrent delete/delete_prefix removed it as empty).
                if attempt == _WRITE_ATTEMPTS - 1:
                    raise
            except (NotADirectoryError, IsADirectoryError, FileExistsError) as e:
                raise ValueError(
                    f"blob key {key!r}: a folder store cannot hold both a key and keys below it ({e})"
                ) from e

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            with mapped_errors(self.url, write=True):
                path.unlink()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        self._remove_empty_folders({path.parent})

    def delete_prefix(self, prefix: str) -> int:
        removed = 0
        folders: set[Path] = set()
        for key in self.list(prefix):
            path = self.root / key
            try:
                with mapped_errors(self.url, write=True):
                    path.unlink()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                continue  # removed meanwhile by someone else
            removed += 1
            folders.add(path.parent)
        self._remove_empty_folders(folders)
        return removed

    def _remove_empty_folders(self, folders: set[Path]) -> None:
        """Remove each folder and its ancestors below the root while they are empty (deepest first)."""
        candidates: set[Path] = set()
        for folder in folders:
            while folder != self.root and self.root in folder.parents:
                candidates.add(folder)
                folder = folder.parent
        for folder in sorted(candidates, key=lambda p: len(p.parts), reverse=True):
            try:
                folder.rmdir()
            except OSError:
                pass  # not empty (another key, a write in progress) or already gone

    # -- reads ------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        with self._open(key) as f, mapped_errors(self.url, write=False):
            return f.read()

    def get_file(self, key: str, path: Path) -> None:
        path = Path(path)
        with self._open(key) as src:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda dst: shutil.copyfileobj(src, dst, _COPY_BUFFER))

    def read_chunks(self, key: str, chunk_bytes: int) -> Iterator[bytes]:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
        f = self._open(key)  # now, so that a missing key raises NotFound here, before any chunk
        return _file_chunks(f, chunk_bytes)

    def size(self, key: str) -> int:
        try:
            st = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"blob not found: {key}") from None
        if not stat.S_ISREG(st.st_mode):
            raise NotFound(f"blob not found: {key}")
        return st.st_size

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        return sorted(key for key, _ in self._walk(prefix))

    def modified_times(self, prefix: str) -> dict[str, float]:
        times = {}
        for key, path in self._walk(prefix):
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                times[key] = path.stat().st_mtime
        return times

    def _walk(self, prefix: str) -> Iterator[tuple[str, Path]]:
        """(key, path) of each stored file whose key starts with `prefix` (writes in progress left out)."""
        check_prefix(prefix)
        # Walk only the deepest folder the prefix names in full; filter the rest by string prefix.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self.root / base if base else self.root
        for folder, dirs, files in os.walk(top):  # errors (a folder removed meanwhile) are skipped
            rel = os.path.relpath(folder, self.root)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            if prefix and not (rel.startswith(prefix) or prefix.startswith(rel)):
                dirs[:] = []
                continue
            for name in files:
                key = rel + name
                if key.startswith(prefix) and not TEMP_NAME.match(name):
                    yield key, Path(folder) / name

    # -- helpers ----------------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _open(self, key: str) -> BinaryIO:
        try:
            with mapped_errors(self.url, write=False):
                return open(self._path(key), "rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFound(f"blob not found: {key}") from None


def _make_folder(folder: Path) -> None:
    """`mkdir -p`, telling a folder removed by a concurrent delete_prefix in the middle of it (pathlib's
    mkdir then raises FileExistsError for a folder that no longer is: retried, as FileNotFoundError)
    from a key's file in the way (FileExistsError, as before)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        if any(p.exists() and not p.is_dir() for p in (folder, *folder.parents)):
            raise
        raise FileNotFoundError(errno.ENOENT, "the folder was removed while it was made", str(folder)) from None


def _file_chunks(f: BinaryIO, chunk_bytes: int) -> Iterator[bytes]:
    with f:
        while chunk := f.read(chunk_bytes):
            yield chunk
