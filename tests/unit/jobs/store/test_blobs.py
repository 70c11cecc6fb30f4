"""The blob store contract (services.jobs.store.blobs), run on both implementations: a folder and S3.

S3 is a real S3-compatible server (moto_server from .venv-s3server, one per session; each test gets its
own key prefix); its tests skip, saying so, when scripts/install.sh has not installed it.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest

from services.jobs.store import open_blob_store
from services.jobs.store.blobs import BlobStore
from services.jobs.store.folder import FolderBlobStore
from services.jobs.store.s3 import S3BlobStore
from services.serving.errors import NotFound, StoreUnavailable
from tests.helpers.s3server import S3Server

MIB = 1024 * 1024


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture(params=["folder", "s3"])
def blob_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    if request.param == "folder":
        store: BlobStore = FolderBlobStore(str(tmp_path / "blobs"))
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        store = S3BlobStore(f"{server.url}/test-{uuid.uuid4().hex}", server.env)
    try:
        yield store
    finally:
        store.close()


def test_put_get_round_trip(blob_store: BlobStore) -> None:
    data = bytes(range(256)) * 10
    blob_store.put("avatars/a1/meta.json", b'{"id": "a1"}')
    blob_store.put("jobs/j1/segments/00003.mp4", data)
    blob_store.put("empty", b"")
    assert blob_store.get("avatars/a1/meta.json") == b'{"id": "a1"}'
    assert blob_store.get("jobs/j1/segments/00003.mp4") == data
    assert blob_store.get("empty") == b""
    assert b"".join(blob_store.read_chunks("empty", 10)) == b""


def test_put_replaces(blob_store: BlobStore) -> None:
    blob_store.put("outputs/x.mp4", b"first version, longer")
    blob_store.put("outputs/x.mp4", b"second")
    assert blob_store.get("outputs/x.mp4") == b"second"
    assert blob_store.size("outputs/x.mp4") == 6
    assert blob_store.list("outputs/") == ["outputs/x.mp4"]


def test_put_file_get_file_multi_mib(blob_store: BlobStore, tmp_path: Path) -> None:
    data = payload(12 * MIB + 7)  # more than two S3 multipart parts (5 MiB each)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    blob_store.put_file("outputs/big.mp4", src)
    assert blob_store.size("outputs/big.mp4") == len(data)

    dest = tmp_path / "down" / "nested" / "big.mp4"  # parent folders do not exist yet
    blob_store.get_file("outputs/big.mp4", dest)
    assert dest.read_bytes() == data
    blob_store.put("outputs/big.mp4", b"small now")
    blob_store.get_file("outputs/big.mp4", dest)  # replaces the file
    assert dest.read_bytes() == b"small now"
    assert os.listdir(dest.parent) == ["big.mp4"]  # no temporary file left behind


def test_put_file_missing_source_is_not_a_blob_error(blob_store: BlobStore, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        blob_store.put_file("k", tmp_path / "nope.bin")
    assert not blob_store.exists("k")


@pytest.mark.parametrize(("size", "chunk"), [(1 * MIB + 123, 64 * 1024), (10, 1), (1000, 4096), (3 * MIB, MIB)])
def test_read_chunks(blob_store: BlobStore, size: int, chunk: int) -> None:
    data = payload(size, seed=size)
    blob_store.put("segments/s.bin", data)
    chunks = list(blob_store.read_chunks("segments/s.bin", chunk))
    assert b"".join(chunks) == data
    assert [len(c) for c in chunks[:-1]] == [chunk] * (len(chunks) - 1)  # full pieces, the last one shorter
    assert 0 < len(chunks[-1]) <= chunk


def test_read_chunks_refuses_a_non_positive_size(blob_store: BlobStore) -> None:
    blob_store.put("k", b"abc")
    with pytest.raises(ValueError, match="chunk_bytes"):
        blob_store.read_chunks("k", 0)


def test_size_and_exists(blob_store: BlobStore) -> None:
    assert not blob_store.exists("a/b.txt")
    blob_store.put("a/b.txt", b"12345")
    assert blob_store.exists("a/b.txt")
    assert blob_store.size("a/b.txt") == 5
    assert not blob_store.exists("a")  # a "folder" is not an object
    assert not blob_store.exists("a/b")


def test_delete(blob_store: BlobStore) -> None:
    blob_store.put("jobs/j1/input.wav", b"wav")
    blob_store.put("jobs/j1/other", b"other")
    blob_store.delete("jobs/j1/input.wav")
    assert not blob_store.exists("jobs/j1/input.wav")
    with pytest.raises(NotFound):
        blob_store.get("jobs/j1/input.wav")
    blob_store.delete("jobs/j1/input.wav")  # missing: not an error
    blob_store.delete("never/was/here")
    assert blob_store.list("") == ["jobs/j1/other"]


def test_delete_prefix(blob_store: BlobStore) -> None:
    keys = [
        "jobs/1/segments/00000.mp4",
        "jobs/1/segments/00001.mp4",
        "jobs/1/out.mp4",
        "jobs/12/out.mp4",
        "jobs/2/out.mp4",
    ]
    for k in keys:
        blob_store.put(k, k.encode())
    assert blob_store.delete_prefix("jobs/1/") == 3
    assert blob_store.list("") == ["jobs/12/out.mp4", "jobs/2/out.mp4"]
    assert blob_store.delete_prefix("jobs/1/") == 0
    assert blob_store.delete_prefix("nothing/") == 0
    assert blob_store.delete_prefix("jobs/1") == 1  # a plain string prefix: jobs/12/...
    assert blob_store.list("") == ["jobs/2/out.mp4"]
    if isinstance(blob_store, FolderBlobStore):  # the emptied folders are gone too
        assert not (blob_store.root / "jobs" / "1").exists()
        assert not (blob_store.root / "jobs" / "12").exists()
        assert (blob_store.root / "jobs" / "2" / "out.mp4").is_file()
    assert blob_store.delete_prefix("") == 1
    assert blob_store.list("") == []
    if isinstance(blob_store, FolderBlobStore):
        assert blob_store.root.is_dir() and os.listdir(blob_store.root) == []


def test_list_sorted_with_prefix(blob_store: BlobStore) -> None:
    keys = [
        "outputs/b.mp4",
        "avatars/x/meta.json",
        "avatars/ab/crops.npy",
        "avatars/a/meta.json",
        "outputs/a.mp4",
        "top",
    ]
    for k in keys:
        blob_store.put(k, b"1")
    assert blob_store.list("") == sorted(keys)
    assert blob_store.list("avatars/") == ["avatars/a/meta.json", "avatars/ab/crops.npy", "avatars/x/meta.json"]
    assert blob_store.list("avatars/a") == ["avatars/a/meta.json", "avatars/ab/crops.npy"]
    assert blob_store.list("avatars/a/") == ["avatars/a/meta.json"]
    assert blob_store.list("outputs/a") == ["outputs/a.mp4"]
    assert blob_store.list("to") == ["top"]
    assert blob_store.list("missing/") == []
    assert blob_store.list("avatars/zz") == []


def test_modified_times_by_prefix(blob_store: BlobStore) -> None:
    before = time.time()
    for key in ("jobs/j1/upload", "jobs/j1/segments/00001.mp4", "jobs/j2/upload", "outputs/j1.mp4"):
        blob_store.put(key, b"1")
    after = time.time()
    times = blob_store.modified_times("jobs/")
    assert sorted(times) == ["jobs/j1/segments/00001.mp4", "jobs/j1/upload", "jobs/j2/upload"]
    # S3 keeps whole seconds; the folder the file system's clock: both within a second of ours
    assert all(before - 1.5 <= t <= after + 1.5 for t in times.values()), (before, times, after)
    assert list(blob_store.modified_times("jobs/j1/segments/")) == ["jobs/j1/segments/00001.mp4"]
    assert blob_store.modified_times("missing/") == {}


def test_missing_key_raises_not_found(blob_store: BlobStore, tmp_path: Path) -> None:
    blob_store.put("avatars/present", b"x")
    for call in (
        lambda: blob_store.get("avatars/missing"),
        lambda: blob_store.size("avatars/missing"),
        lambda: blob_store.read_chunks("avatars/missing", 1024),  # at the call, before any chunk
        lambda: blob_store.get_file("avatars/missing", tmp_path / "out.bin"),
        lambda: blob_store.get("avatars"),  # a "folder"
    ):
        with pytest.raises(NotFound, match="avatars"):
            call()
    assert not (tmp_path / "out.bin").exists()


BAD_KEYS = [
    "",
    "/abs/key",
    "a/../b",
    "..",
    "../up",
    "a\\b",
    "a\x00b",
    "a//b",
    "a/",
    "./a",
    "a/.x.0123456789abcdef0123456789abcdef.tmp",
]


def test_invalid_keys_refused(blob_store: BlobStore) -> None:
    for key in BAD_KEYS:
        for call in (
            lambda: blob_store.put(key, b"x"),
            lambda: blob_store.get(key),
            lambda: blob_store.exists(key),
            lambda: blob_store.delete(key),
        ):
            with pytest.raises(ValueError, match="invalid blob key"):
                call()
    for prefix in ["/abs", "a/../", "..", "a\\b"]:
        with pytest.raises(ValueError, match="invalid blob prefix"):
            blob_store.list(prefix)
    assert blob_store.list("") == []
    if isinstance(blob_store, FolderBlobStore):
        assert not (blob_store.root.parent / "b").exists()


def test_put_is_atomic(blob_store: BlobStore, tmp_path: Path) -> None:
    """While a large put is in progress in another thread, the key is absent or complete, never partial."""
    data = payload(16 * MIB)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    errors: list[BaseException] = []

    def upload() -> None:
        try:
            blob_store.put_file("outputs/video.mp4", src)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    writer = threading.Thread(target=upload)
    writer.start()
    seen = set()
    while writer.is_alive():
        try:
            seen.add(blob_store.size("outputs/video.mp4"))
        except NotFound:
            seen.add(None)
        assert set(blob_store.list("")) <= {"outputs/video.mp4"}
    writer.join()
    assert not errors
    assert seen <= {None, len(data)}
    assert blob_store.get("outputs/video.mp4") == data
    assert blob_store.list("") == ["outputs/video.mp4"]


def test_folder_write_in_progress_is_invisible(tmp_path: Path) -> None:
    """Deterministic: the source is a pipe that the test fills half, so the put is stuck mid-write."""
    store = FolderBlobStore(f"file://{tmp_path / 'blobs'}")
    fifo = tmp_path / "source.fifo"
    os.mkfifo(fifo)
    data = payload(2 * MIB, seed=7)
    errors: list[BaseException] = []

    def upload() -> None:
        try:
            store.put_file("outputs/video.mp4", fifo)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    writer = threading.Thread(target=upload)
    writer.start()
    folder = tmp_path / "blobs" / "outputs"
    with open(fifo, "wb") as pipe:
        pipe.write(data[:MIB])
        pipe.flush()
        deadline = time.monotonic() + 10
        while not (temps := list(folder.glob(".video.mp4.*.tmp"))) or temps[0].stat().st_size == 0:
            assert time.monotonic() < deadline, "the put never started writing its temporary file"
            time.sleep(0.01)
        # Half written: on disk as a temporary file only, invisible through the store.
        assert not store.exists("outputs/video.mp4")
        with pytest.raises(NotFound):
            store.get("outputs/video.mp4")
        assert store.list("") == []
        assert store.list("outputs/") == []
        pipe.write(data[MIB:])
    writer.join(10)
    assert not errors
    assert store.get("outputs/video.mp4") == data
    assert os.listdir(folder) == ["video.mp4"]


def test_concurrent_puts_from_threads(blob_store: BlobStore) -> None:
    def work(t: int) -> None:
        for i in range(8):
            key = f"jobs/{t}/segments/{i:05d}.mp4"
            blob_store.put(key, key.encode() * 100)
            assert blob_store.get(key) == key.encode() * 100

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    keys = blob_store.list("jobs/")
    assert keys == sorted(f"jobs/{t}/segments/{i:05d}.mp4" for t in range(8) for i in range(8))
    for k in keys:
        assert blob_store.get(k) == k.encode() * 100


def test_a_folder_store_refuses_a_key_where_keys_are_below_it_and_the_reverse(tmp_path: Path) -> None:
    """A key's file in the way of a folder (or a folder in the way of a key) is a ValueError naming the
    key, never retried as the race with delete_prefix is: the race's retry must not swallow it."""
    store = FolderBlobStore(f"file://{tmp_path / 'blobs'}")
    store.put("a", b"x")
    with pytest.raises(ValueError, match="'a/b/c'.*cannot hold both a key and keys below it"):
        store.put("a/b/c", b"y")
    store.put("d/e", b"z")
    with pytest.raises(ValueError, match="'d'.*cannot hold both"):
        store.put("d", b"w")
    assert (store.get("a"), store.get("d/e")) == (b"x", b"z")


def test_concurrent_put_and_delete_prefix_in_one_folder(blob_store: BlobStore) -> None:
    """A writer and a delete_prefix that empties (and, on a folder, removes) the same folder race."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def deleter() -> None:
        try:
            while not stop.is_set():
                blob_store.delete_prefix("jobs/race/")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=deleter)
    thread.start()
    try:
        for i in range(40):
            blob_store.put(f"jobs/race/{i}", b"x")
    finally:
        stop.set()
        thread.join()
    assert not errors


def test_s3_unreachable_is_store_unavailable(refused_port: int) -> None:
    port = refused_port  # bound, never listening: nobody else can take it during the test
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    store = S3BlobStore(
        "s3://bucket/prefix",
        env,
        client_options={"connect_timeout": timedelta(seconds=1), "timeout": timedelta(seconds=2)},
        retry_config={
            "max_retries": 2,
            "retry_timeout": timedelta(seconds=2),
            "backoff": {"init_backoff": timedelta(milliseconds=50)},
        },
    )
    start = time.monotonic()
    for call in (
        lambda: store.put("k", b"x"),
        lambda: store.get("k"),
        lambda: store.size("k"),
        lambda: store.exists("k"),
        lambda: store.read_chunks("k", 10),
        lambda: store.list(""),
        lambda: store.delete("k"),
    ):
        with pytest.raises(StoreUnavailable, match="cannot be reached"):
            call()
    assert time.monotonic() - start < 10


def test_s3_missing_bucket_is_store_unavailable(s3_server: S3Server) -> None:
    store = S3BlobStore("s3://no-such-bucket/p", s3_server.env)
    with pytest.raises(StoreUnavailable, match="no-such-bucket"):
        store.put("k", b"x")
    with pytest.raises(StoreUnavailable, match="no-such-bucket"):
        store.get("k")


def test_open_blob_store_and_urls(tmp_path: Path) -> None:
    assert isinstance(open_blob_store(str(tmp_path / "a")), FolderBlobStore)
    folder = open_blob_store(f"file://{tmp_path / 'b'}")
    assert isinstance(folder, FolderBlobStore) and folder.root == tmp_path / "b" and folder.root.is_dir()
    s3 = S3BlobStore("s3://bucket/some/prefix/", {"AWS_ENDPOINT_URL": "http://127.0.0.1:1"})
    assert (s3.bucket, s3.prefix) == ("bucket", "some/prefix")
    for bad in ["s3://", "s3:///prefix", "s3://bucket/a/../b", "s3://bucket/p?x=1"]:
        with pytest.raises(ValueError):
            S3BlobStore(bad, {})
    with pytest.raises(ValueError):
        FolderBlobStore("file://otherhost/path")
