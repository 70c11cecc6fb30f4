"""LiveService in this process (so its registries can be read), against the real lipsync stage (its
own process, procedural, CPU), an SQLite job store and a folder blob store holding two avatars saved
as CreateAvatar saves them. Sessions are opened and conversed on through gRPC on 127.0.0.1, as the
gateway does; tests/integration/test_live_worker.py runs the worker as a process.

What a closed session leaves behind is a leak: issue 29 found a worker keeping memory for sessions
long closed. Checked here by what the worker holds (`LiveService.footprint`) and by the session's
objects being freed, not by RSS, which the allocator keeps.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from lipline.v1 import live_pb2, live_pb2_grpc, session_pb2
from services.jobs.avatars import AvatarMeta, new_avatar_id, save_avatar
from services.jobs.store import open_job_store
from services.jobs.store.folder import FolderBlobStore
from services.jobs.store.jobs import AvatarRecord, JobStore
from services.lipsync.faces import HaarFaceDetector, prepare_boxes
from services.live.service import LiveService
from services.live.settings import LiveSettings
from services.local.cluster import LOCAL_FLAGS
from services.local.process import ServiceProcess, start
from services.media.crops import crop_and_resize
from services.media.decode import decode_avatar
from services.serving.metrics import Metrics
from services.serving.server import ServiceRunner

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
TENANT = (("x-lipline-tenant", "acme"),)
RATE = 16000


class RunningWorker:
    """A LiveService on its own event loop thread, serving on 127.0.0.1; `call` runs a coroutine there."""

    def __init__(self, settings: LiveSettings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="live-service", daemon=True)

    def __enter__(self) -> RunningWorker:
        self.thread.start()

        async def start_it() -> ServiceRunner:
            runner = ServiceRunner(LiveService(self.settings, Metrics("live")))
            await runner.start()
            return runner

        self.runner = self.call(start_it(), 120)
        self.service: LiveService = self.runner.service  # type: ignore[assignment]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.runner.port}")
        self.stub = live_pb2_grpc.LiveServiceStub(self.channel)
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()
        self.call(self.runner.stop(), 60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def call(self, coroutine, timeout: float = 30.0):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def footprint(self) -> dict[str, int]:
        async def read() -> dict[str, int]:
            return self.service.footprint()

        return self.call(read())


def save_sample_avatar(blobs: FolderBlobStore, jobs: JobStore, shift: int) -> str:
    """The sample photo (shifted by `shift` columns: a different avatar) saved as CreateAvatar saves it."""
    data = (SAMPLES / "avatar.jpg").read_bytes()
    frames, fps = decode_avatar(data)
    frames = np.roll(frames, shift, axis=2)
    (box,) = prepare_boxes(HaarFaceDetector().detect(list(frames)), *frames.shape[1:3])
    box = tuple(int(v) for v in box)
    aid = new_avatar_id()
    meta = AvatarMeta(aid, "photo", fps, fps, 1, frames.shape[2], frames.shape[1], [box], time.time())
    import cv2

    ok, encoded = cv2.imencode(".png", frames[0])
    assert ok
    save_avatar(blobs, meta, encoded.tobytes(), crop_and_resize(frames[0], box)[None])
    jobs.put_avatar(AvatarRecord(aid, "photo", fps, 1, meta.width, meta.height, 1, time.time(), tenant="acme"))
    return aid


@pytest.fixture(scope="module")
def lipsync(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    process = start(
        "lipsync",
        "lipsync",
        ["--device=cpu", "--detector=none"],
        tmp_path_factory.mktemp("lipsync"),
        base_args=LOCAL_FLAGS,
    )
    try:
        process.wait_ready(180)
        yield process
    finally:
        process.kill()


@pytest.fixture
def worker(tmp_path: Path, lipsync: ServiceProcess) -> Iterator[tuple[RunningWorker, JobStore, list[str]]]:
    blobs = FolderBlobStore(str(tmp_path / "blobs"))
    store = f"sqlite:///{tmp_path / 'lipline.db'}"
    jobs = open_job_store(store)
    jobs.migrate()
    avatars = [save_sample_avatar(blobs, jobs, shift) for shift in (0, 8)]
    settings = LiveSettings(
        host="127.0.0.1",
        port=0,
        metrics_port=-1,
        job_store=store,
        blob_store=str(tmp_path / "blobs"),
        lipsync_address=lipsync.address,
        superres_address="",
        cache_dir=str(tmp_path / "cache"),
        max_sessions=8,
    )
    try:
        with RunningWorker(settings) as running:
            yield running, jobs, avatars
    finally:
        jobs.close()


def open_session(running: RunningWorker, jobs: JobStore, avatar_id: str, **video: int) -> str:
    session = session_pb2.Session(
        id=uuid.uuid4().hex,
        avatar_id=avatar_id,
        audio=session_pb2.AudioFormat(sample_rate=RATE),
        video=session_pb2.VideoFormat(**video),
    )
    asyncio.run(jobs.create_session("acme", session.id, avatar_id, session.SerializeToString(), "0" * 64))
    running.stub.OpenSession(live_pb2.OpenSessionRequest(session=session, tenant="acme"), timeout=60)
    return session.id


def converse(running: RunningWorker, session_id: str, frames: int, pcm: bytes = b"") -> grpc.Future:
    """A Converse stream that sends `pcm` in 20 ms chunks and reads `frames` frames; the call (left open)."""

    def requests() -> Iterator[session_pb2.ConverseRequest]:
        yield session_pb2.ConverseRequest(start=session_pb2.ConverseStart(session_id=session_id))
        for i in range(0, len(pcm), 640):
            yield session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=pcm[i : i + 640]))
            time.sleep(0.02)
        time.sleep(60)  # the stream stays open until the test cancels it

    call = running.stub.Converse(requests(), metadata=TENANT)
    got = 0
    for response in call:
        got += response.WhichOneof("response") == "frame"
        if got >= frames:
            break
    return call


def test_a_closed_session_leaves_nothing_behind(worker: tuple[RunningWorker, JobStore, list[str]]) -> None:
    running, jobs, (first, second) = worker
    speech = (np.sin(np.arange(RATE // 2) / 9) * 8000).astype("<i2").tobytes()  # 0.5 s of "speech"
    held: list[weakref.ref] = []
    for avatar, video in ((first, {}), (first, {"codec": session_pb2.VIDEO_CODEC_JPEG}), (second, {})):
        session_id = open_session(running, jobs, avatar, **video)
        runner = running.service.sessions[session_id]
        held += [weakref.ref(runner), weakref.ref(runner.live), weakref.ref(runner.live.encoder)]
        del runner
        call = converse(running, session_id, frames=30, pcm=speech)
        running.stub.CloseSession(session_pb2.CloseSessionRequest(session_id=session_id), metadata=TENANT, timeout=10)
        call.cancel()
    # A reader that stopped reading (JPEG at quality 100: its send queue fills), closed meanwhile.
    stalled = open_session(running, jobs, second, codec=session_pb2.VIDEO_CODEC_JPEG, jpeg_quality=100)
    call = converse(running, stalled, frames=1)
    time.sleep(2.0)
    running.stub.CloseSession(session_pb2.CloseSessionRequest(session_id=stalled), metadata=TENANT, timeout=10)
    call.cancel()
    deadline = time.monotonic() + 30
    while any(running.footprint().values()) and time.monotonic() < deadline:
        time.sleep(0.1)  # a session's row is marked CLOSED a moment after its answer
    assert running.footprint() == dict.fromkeys(running.footprint(), 0)
    while any(ref() is not None for ref in held) and time.monotonic() < deadline:
        running.call(asyncio.sleep(0.1))
        gc.collect()
    assert [ref() is None for ref in held] == [True] * len(held), (
        "a closed session's runner, session or encoder is still held"
    )
    # The avatars were closed with their last session; a new session opens one again.
    again = open_session(running, jobs, first)
    assert running.footprint()["avatars_open"] == 1 and running.footprint()["link_sessions"] == 1
    running.stub.CloseSession(session_pb2.CloseSessionRequest(session_id=again), metadata=TENANT, timeout=10)
