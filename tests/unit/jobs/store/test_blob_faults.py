"""Blob store faults (issue 17 item 4): full, read-only and unreachable stores answer a status that
names the store and says what to do, fast, and leave nothing partial behind.

On main a full or read-only folder raised a bare OSError (INTERNAL at the gateway, a failed job at a
worker). The folder tests use a real tmpfs (tests.helpers.mounts; they skip without CAP_SYS_ADMIN);
the S3 one stops a real S3 server (moto) under the store.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest

from services.jobs.store.folder import FolderBlobStore
from services.jobs.store.s3 import S3BlobStore
from services.serving.errors import StorageFull, StoreUnavailable
from tests.helpers.mounts import fill, set_read_only, tmpfs
from tests.helpers.s3server import S3Server, moto_server_binary


def leftovers(root: Path) -> list[str]:
    """Every file and folder under `root` but the filler (temporary files included)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name != ".filler")


def test_a_full_folder_is_resource_exhausted_naming_the_store(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "blobs") as root:
        store = FolderBlobStore(f"file://{root}")
        store.put("kept/a", b"x")
        filler = fill(root)
        started = time.monotonic()
        with pytest.raises(StorageFull) as info:
            store.put("jobs/j1/segments/00001.mp4", os.urandom(64 * 1024))
        assert time.monotonic() - started < 2
        assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"the blob store file://{root} is full" in str(info.value) and "free space" in str(info.value)
        local = tmp_path / "big"
        local.write_bytes(os.urandom(64 * 1024))
        with pytest.raises(StorageFull):
            store.put_file("jobs/j1/out.mp4", local)
        assert leftovers(root) == ["kept", "kept/a"]  # no temporary file, no empty folder
        filler.unlink()
        store.put("jobs/j1/segments/00001.mp4", b"y")  # space freed: it works again
        assert store.get("jobs/j1/segments/00001.mp4") == b"y"


def test_a_read_only_folder_is_unavailable_naming_the_store(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "blobs") as root:
        store = FolderBlobStore(str(root))
        store.put("kept/a", b"x")
        set_read_only(root, True)
        try:
            for write in (
                lambda: store.put("jobs/j1/a", b"x"),
                lambda: store.delete("kept/a"),
                lambda: store.delete_prefix("kept/"),
            ):
                with pytest.raises(
                    StoreUnavailable, match=rf"the blob store {root} is read-only .*mount it read-write"
                ) as info:
                    write()
                assert info.value.code == grpc.StatusCode.UNAVAILABLE
            assert store.get("kept/a") == b"x"  # reads still work
        finally:
            set_read_only(root, False)
        assert leftovers(root) == ["kept", "kept/a"]
        store.put("jobs/j1/a", b"x")


def test_s3_stopped_under_the_store_is_unavailable_within_seconds(tmp_path: Path) -> None:
    """With the default retry settings (main's retried for 30 s before answering)."""
    moto_server_binary()  # skips, saying why, when it is not installed
    server = S3Server().__enter__()
    try:
        store = S3BlobStore(f"{server.url}/faults", server.env)
        store.put("a", b"x")
    finally:
        server.__exit__(None, None, None)
    started = time.monotonic()
    with pytest.raises(
        StoreUnavailable, match=rf"the S3 blob store {server.url}/faults cannot be reached .*then retry"
    ) as info:
        store.get("a")
    assert time.monotonic() - started < 12
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
