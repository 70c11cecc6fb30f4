"""Issue 19 through the public API: live sessions placed, relayed, resumed and refused by the gateway,
with real processes on 127.0.0.1 (the live worker itself is tests/integration/test_live_worker.py's).

One cluster per job store (SQLite, then PostgreSQL: placement is SQL): the gateway, the lipsync stage
(procedural) and two live workers of capacity 2; no render workers. The tests run in order: a
session end to end with the command-line client's pieces (the MP4 it writes decodes), a stream cut
and resumed on the same worker, the worker killed with SIGKILL and the session resumed on the other,
then admission with the one worker left, and a drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import av
import grpc
import numpy as np
import pytest

from lipline.v1 import gateway_pb2_grpc, session_pb2
from lipline_client import NO_RETRY
from services.gateway.client import LiplineClient
from services.gateway.live_client import frame_audio, pcm_chunks, pcm_of_audio, run_session, write_mp4
from services.gateway.live_workers import LIVE_STREAM_WINDOW_BYTES
from services.jobs.store import open_job_store
from services.jobs.store.jobs import JobStore
from services.jobs.store.sessions import SessionRow
from services.local.cluster import LocalCluster
from services.media.probe import probe_media
from tests.integration.util import (
    SAMPLES,
    assert_audio_locked,
    cut_wav,
    eventually,
    process_metric,
    silent_frames_between,
    start_cluster,
)

RATE, FPS = 16000, 25
LIVE = ("live", "live-1")


@dataclass
class Live:
    cluster: LocalCluster
    client: LiplineClient
    jobs: JobStore
    avatar_id: str
    speech: bytes  # PCM s16le mono at RATE
    opened: list[str] = field(default_factory=list)  # sessions the current test created

    def open(self, **options: object) -> session_pb2.Session:
        """A session of the module's avatar, closed after the test whatever its outcome (a test that fails
        half-way would otherwise leave it holding a worker's room for the next test)."""
        session = self.client.create_session(self.avatar_id, **options)  # type: ignore[arg-type]
        self.opened.append(session.id)
        return session

    def row(self, session_id: str) -> SessionRow:
        return asyncio.run(self.jobs.get_session_row(session_id))

    def worker_of(self, session_id: str) -> str:
        """The cluster's name of the live worker holding the session."""
        address = self.row(session_id).worker_address
        return next(n for n in LIVE if self.cluster.processes[n].address == address)


@pytest.fixture(scope="module")
def live(job_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    workdir = tmp_path_factory.mktemp("live")
    extra = {"live": ["--max-sessions=2", "--superres-address="]}
    with start_cluster(
        workdir / "cluster", job_store=job_store_url, replicas={"render": 0, "live": 2}, extra_args=extra
    ) as cluster:
        client = LiplineClient(cluster.gateway_address, timeout=120)
        jobs = open_job_store(job_store_url)
        try:
            avatar = client.create_avatar((SAMPLES / "avatar.jpg").read_bytes(), name="live")
            speech = pcm_of_audio(cut_wav((SAMPLES / "speech.wav").read_bytes(), 2.0), RATE)
            yield Live(cluster, client, jobs, avatar.id, speech)
        finally:
            client.close()
            jobs.close()


@pytest.fixture(autouse=True)
def _closes_what_it_opened(live: Live) -> Iterator[None]:
    yield
    for session_id in live.opened:
        with contextlib.suppress(grpc.RpcError):  # closed by the test already, or its worker was killed
            live.client.close_session(session_id)
    live.opened.clear()


class Stream:
    """A Converse stream through the gateway, driven from a thread: requests queued, responses kept."""

    def __init__(self, client: LiplineClient, session: session_pb2.Session, last_frame: int = -1) -> None:
        self.requests: queue.Queue = queue.Queue()
        start = session_pb2.ConverseStart(
            session_id=session.id, resume_token=session.resume_token, last_frame=last_frame
        )
        self.requests.put(session_pb2.ConverseRequest(start=start))
        self.call = client.converse(iter(self.requests.get, None))
        self.frames: list[session_pb2.VideoFrame] = []
        self.ready: session_pb2.Ready | None = None
        self.finished = 0
        self.events: list[session_pb2.SessionEvent] = []
        self.stats: list[session_pb2.SessionStats] = []
        self.error: grpc.RpcError | None = None
        self.thread = threading.Thread(target=self._receive, daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        try:
            for response in self.call:
                kind = response.WhichOneof("response")
                if kind == "frame":
                    self.frames.append(response.frame)
                elif kind == "ready":
                    self.ready = response.ready
                elif kind == "event":
                    self.events.append(response.event)
                    self.finished += response.event.kind == session_pb2.SessionEvent.PLAYBACK_FINISHED
                elif kind == "stats":
                    self.stats.append(response.stats)
        except grpc.RpcError as exc:
            self.error = exc

    def say(self, pcm: bytes) -> None:
        """One utterance in real time, 20 ms chunks."""
        started = time.monotonic()
        for i, chunk in enumerate(pcm_chunks(pcm, RATE, 20)):
            self.requests.put(session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=chunk)))
            time.sleep(max(0.0, started + (i + 1) * 0.02 - time.monotonic()))
        self.requests.put(session_pb2.ConverseRequest(end_of_utterance=session_pb2.EndOfUtterance()))

    def wait(self, check, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
        def ok() -> bool:
            assert self.error is None, f"the stream ended: {self.error.code()} {self.error.details()}"
            return bool(check())

        eventually(ok, timeout=timeout, what=what, every=0.02)

    def cut(self) -> None:
        self.call.cancel()
        self.requests.put(None)
        self.thread.join(10)


def steady(frames: list[session_pb2.VideoFrame]) -> bool:
    """Indices that only grow. Slots may be missing: a loaded 2-core machine deschedules the worker (a
    late frame is skipped, never delayed) or the reader (the oldest frames are dropped past `send_lag_s`);
    how many depends on the machine, so the tests check that the worker counted them instead. On the GPU
    host 100 sessions skip 0-2 % of frames (docs/performance.md)."""
    indices = [f.index for f in frames]
    return all(b > a for a, b in zip(indices, indices[1:]))


def test_a_session_end_to_end_through_the_gateway(live: Live, tmp_path: Path) -> None:
    session, recorder = run_session(
        live.client, live.avatar_id, cut_wav((SAMPLES / "speech.wav").read_bytes(), 2.0), write=print
    )
    assert (session.width, session.height, session.video.fps, session.state) == (
        512,
        512,
        25.0,
        session_pb2.SESSION_STATE_ACTIVE,
    )
    assert len(session.resume_token) >= 40
    frames = recorder.frames
    assert recorder.ready is not None and recorder.ready.session.id == session.id
    assert frames and steady(frames) and frames[0].keyframe
    gaps = frames[-1].index - frames[0].index + 1 - len(frames)
    assert (
        gaps <= recorder.stats[-1].frames_skipped + recorder.stats[-1].frames_dropped + FPS
    )  # every gap counted (the last stats, sent once a second, may precede a second of them)
    # The re-timed audio is the input, sample for sample, from the frame the utterance started at.
    (started,) = [e.frame for e in recorder.events if e.kind == session_pb2.SessionEvent.PLAYBACK_STARTED]
    track, span = frame_audio(recorder), 2 * RATE // FPS
    pauses = silent_frames_between(track[(started - frames[0].index) * span :], live.speech, span)
    print(f"the utterance paused for {pauses} silent frames (late chunks of a real-time sender)")
    assert sum(f.speech for f in frames) >= int(np.ceil(len(live.speech) / span)) - gaps
    print(recorder.summary())
    path = tmp_path / "live.mp4"
    write_mp4(path, recorder, session.video.codec, session.width, session.height)
    info = probe_media(path)
    assert (info["video_codec"], info["audio_codec"], info["frames"]) == ("h264", "aac", len(frames))
    closed = live.client.get_session(session.id)  # run_session closed it
    assert (closed.state, closed.error, closed.resume_token) == (
        session_pb2.SESSION_STATE_CLOSED,
        "closed by CloseSession",
        "",
    )
    ended = Stream(live.client, session)
    ended.thread.join(10)
    assert (
        ended.error is not None
        and ended.error.code() == grpc.StatusCode.FAILED_PRECONDITION
        and "CLOSED" in ended.error.details()
    )
    with pytest.raises(grpc.RpcError) as empty:
        list(live.client.converse(iter([])))
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ConverseStart" in empty.value.details()


def test_bad_input_gets_a_clear_status_and_the_session_lives_on(live: Live) -> None:
    session = live.open()
    odd = Stream(live.client, session)
    odd.wait(lambda: odd.ready is not None, "Ready")
    odd.requests.put(session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=b"\x00\x01\x02")))
    odd.thread.join(10)
    assert odd.error is not None and odd.error.code() == grpc.StatusCode.INVALID_ARGUMENT, odd.error
    assert "even byte count" in odd.error.details()  # the worker's own words, through the gateway
    stranger = session_pb2.Session(id="0" * 20, resume_token=session.resume_token)
    wrong = session_pb2.Session(id=session.id, resume_token=session.resume_token[::-1])
    for other, code in ((stranger, grpc.StatusCode.NOT_FOUND), (wrong, grpc.StatusCode.PERMISSION_DENIED)):
        refused = Stream(live.client, other)
        refused.thread.join(10)
        assert refused.error is not None and refused.error.code() == code, refused.error
    again = Stream(live.client, session)  # a new stream on the same session plays speech
    again.say(live.speech[:RATE])
    again.wait(lambda: again.finished, "speech after the bad chunk")
    again.cut()
    live.client.close_session(session.id)


def test_a_cut_stream_resumes_on_the_same_worker(live: Live) -> None:
    session = live.open()
    worker = live.worker_of(session.id)
    talk = Stream(live.client, session)
    talk.wait(lambda: len(talk.frames) > 10, "frames")
    talk.cut()
    last = talk.frames[-1].index
    again = Stream(live.client, session, last_frame=last)
    again.wait(lambda: again.ready is not None and len(again.frames) > 5, "frames after the resume")
    assert again.ready.next_frame > last and again.frames[0].keyframe and steady(again.frames)
    again.say(live.speech[:RATE])  # 0.5 s of speech
    again.wait(lambda: again.finished, "the utterance played")
    assert live.worker_of(session.id) == worker
    again.cut()
    live.client.close_session(session.id)


ACK_WINDOW = 25  # frames the slow reader lets the gateway send past its last FrameAck (1 s)
STALL_S = 7.0  # the 20 s behaves the same: what matters is that the stall outlasts every buffer


class SlowReader:
    """A Converse stream through the gateway whose reader stops reading for a while (a viewer whose app
    stalled), then reads again. Its channel has gRPC's defaults (a receive window that BDP probing grows:
    it took ~600 KB of a stall without pushing back), and it acknowledges each frame it takes
    (ConverseStart.ack_window), which is what bounds the past it finds when it reads again."""

    def __init__(self, address: str, session: session_pb2.Session) -> None:
        self.channel = grpc.insecure_channel(address)
        self.requests: queue.Queue = queue.Queue()
        start = session_pb2.ConverseStart(
            session_id=session.id, resume_token=session.resume_token, ack_window=ACK_WINDOW
        )
        self.requests.put(session_pb2.ConverseRequest(start=start))
        self.call = gateway_pb2_grpc.GatewayStub(self.channel).Converse(iter(self.requests.get, None))
        self.reading = threading.Event()
        self.reading.set()
        self.frames: list[session_pb2.VideoFrame] = []
        self.sizes: list[int] = []  # each frame's message, as it came over the wire
        self.stats: list[session_pb2.SessionStats] = []
        self.error: grpc.RpcError | None = None
        self.thread = threading.Thread(target=self._receive, daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        try:
            for response in self.call:
                self.reading.wait()
                kind = response.WhichOneof("response")
                if kind == "frame":
                    self.frames.append(response.frame)
                    self.sizes.append(response.ByteSize())
                    self.requests.put(session_pb2.ConverseRequest(ack=session_pb2.FrameAck(frame=response.frame.index)))
                elif kind == "stats":
                    self.stats.append(response.stats)
        except grpc.RpcError as exc:
            self.error = exc

    def wait(self, check, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
        def ok() -> bool:
            assert self.error is None, f"the stream ended: {self.error.code()} {self.error.details()}"
            return bool(check())

        eventually(ok, timeout=timeout, what=what, every=0.02)

    def cut(self) -> None:
        self.call.cancel()
        self.requests.put(None)
        self.thread.join(10)
        self.channel.close()


def nal_types(access_unit: bytes) -> set[int]:
    """The NAL unit types in an Annex B access unit (5: an IDR slice, 7: SPS, 8: PPS)."""
    return {access_unit[i + 3] & 0x1F for i in range(len(access_unit) - 3) if access_unit[i : i + 3] == b"\0\0\1"}


@pytest.mark.parametrize(
    "codec", [session_pb2.VIDEO_CODEC_H264, session_pb2.VIDEO_CODEC_JPEG], ids=["h264", "jpeg_quality_100"]
)
def test_a_reader_that_stops_reading_gets_the_live_edge_when_it_reads_again(live: Live, codec: int) -> None:
    """Issue 29: a client with gRPC's default window stops reading for a while (idle frames: tiny
    P-frames, the case where gRPC's buffers held the whole stall), then reads again. It gets what was
    on its way before it stopped (bounded: the frames it had not acknowledged, the gateway's 16 KiB
    window for the worker's stream, a message in hand), then frames from the live edge, starting at a
    keyframe (an IDR); the frames in between were dropped, oldest first, and counted in the stats and
    the metric."""
    quality = 100 if codec == session_pb2.VIDEO_CODEC_JPEG else 0
    session = live.open(codec=codec, jpeg_quality=quality)
    worker = live.worker_of(session.id)
    reader = SlowReader(live.cluster.gateway_address, session)
    reader.wait(lambda: len(reader.frames) > 25, "frames before the stall")
    reader.reading.clear()
    time.sleep(0.1)  # a frame being recorded as it was cleared is in
    before, last = len(reader.frames), reader.frames[-1].index
    time.sleep(STALL_S)
    resumed_at = time.time()
    reader.reading.set()
    created = session.create_time.ToNanoseconds() / 1e9
    live_edge = math.floor((resumed_at - created) * FPS)  # the frame due when the reader read again
    reader.wait(lambda: reader.frames[-1].index > live_edge + FPS, "a second of frames from the live edge")
    after = reader.frames[before:]
    split = next(i for i, f in enumerate(after) if f.index >= live_edge - 3 * FPS)  # the past, then the present
    past, present = after[:split], after[split:]
    past_bytes, biggest = sum(reader.sizes[before : before + split]), max(reader.sizes)
    print(
        f"after a {STALL_S:g} s stall: {len(past)} frames of the past ({past_bytes} bytes), then frame "
        f"{present[0].index} with the live edge at {live_edge} ({(live_edge - present[0].index) / FPS:.2f} s behind)"
    )
    # The past is what was on its way before the reader stopped: frames right after the last one read,
    # at most ACK_WINDOW unacknowledged ones, what the gateway's window for the worker's stream holds and
    # the messages in hand (4: the worker's, the gateway's, the reader's own, one to spare); never the
    # stall's frames (without acknowledgements: ~600 KB, hundreds of frames, through gRPC's default window).
    assert all(b.index > a.index for a, b in zip(after, after[1:]))
    assert not past or past[0].index <= last + 2 * FPS
    # gRPC lets a little more than its 16 KiB window through (the message a read waits for, its own
    # buffers: measured 42-45 idle H.264 frames in all, 25 of them unacknowledged), hence twice the window.
    in_window = 2 * LIVE_STREAM_WINDOW_BYTES // min(reader.sizes)
    assert len(past) <= ACK_WINDOW + in_window + 4, (len(past), in_window)
    assert past_bytes <= LIVE_STREAM_WINDOW_BYTES + (ACK_WINDOW + 4) * biggest, (len(past), past_bytes, biggest)
    # The present starts at a keyframe (H.264: an IDR with its SPS and PPS) within a second of the live edge.
    first = present[0]
    assert first.keyframe and first.index >= live_edge - 1.5 * FPS, (first.index, live_edge)
    if codec == session_pb2.VIDEO_CODEC_H264:
        assert {5, 7, 8} <= nal_types(first.data), nal_types(first.data)
        decoder = av.CodecContext.create("h264", "r")
        pictures = [p for f in present for p in decoder.decode(av.Packet(f.data))] + decoder.decode(None)
        assert len(pictures) == len(present)  # a decoder starts there and never stumbles
    # The frames between are dropped (with their audio) and counted, in the stats and the metric.
    missing = first.index - (past[-1].index if past else last) - 1
    reader.wait(
        lambda: reader.stats and reader.stats[-1].frames_dropped + reader.stats[-1].frames_skipped >= missing,
        "stats counting the frames dropped",
    )
    assert reader.stats[-1].frames_dropped > 0
    assert (
        process_metric(live.cluster, worker, "lipline_live_frames_total", kind="dropped")
        >= reader.stats[-1].frames_dropped
    )
    assert first.audio and len(first.audio) % (2 * RATE // FPS) == 0  # whole slots: its own (and skipped ones')
    reader.cut()
    live.client.close_session(session.id)


def wait_until_the_workers_are_empty(live: Live) -> None:
    """Every running live worker is up and holds no session: sessions earlier tests closed are gone from the
    heartbeats and leases (a close is acted on asynchronously: on a loaded machine the next test could
    otherwise meet a worker still full), and a worker an earlier test restarted heartbeats again (until
    then the gateway sees one worker, and a session moved off the other finds no room)."""

    running = sum(live.cluster.processes[name].process.poll() is None for name in LIVE)

    def empty() -> bool:
        workers = asyncio.run(live.jobs.live_workers(5.0))
        return len(workers) == running and all(w.active == 0 and w.leased == 0 for w in workers)

    eventually(empty, timeout=60, what=f"the {running} running live workers to be up and hold no session")


def test_a_killed_worker_loses_its_session_to_the_other(live: Live) -> None:
    wait_until_the_workers_are_empty(live)
    session = live.open()
    doomed = live.worker_of(session.id)
    talk = Stream(live.client, session)
    talk.wait(lambda: len(talk.frames) > 5, "frames")
    live.cluster.kill(doomed)  # SIGKILL: no drain, its lease and heartbeat row stay behind
    talk.thread.join(20)
    assert talk.error is not None and talk.error.code() == grpc.StatusCode.UNAVAILABLE, talk.error
    assert "resume" in talk.error.details()
    time.sleep(2.0)  # nobody holds the session for a while: its frames must show the gap
    started, resumed_at = time.monotonic(), time.time()
    resumed = Stream(live.client, session, last_frame=talk.frames[-1].index)
    resumed.wait(lambda: len(resumed.frames) > 5, "frames from the other worker")
    print(f"resume after SIGKILL: first frames within {time.monotonic() - started:.2f} s")
    survivor = next(n for n in LIVE if n != doomed)
    assert live.worker_of(session.id) == survivor and resumed.frames[0].keyframe and steady(resumed.frames)
    # The other worker numbers frames on the session's clock (frame k is due k / fps after it was
    # created), not on from the last frame: its first frame is one due after the resume began, never
    # before it (0.5 s for the machines' clocks, which here are one).
    created = session.create_time.ToNanoseconds() / 1e9
    first = resumed.frames[0].index
    assert created + first / FPS >= resumed_at - 0.5, (first, talk.frames[-1].index)
    assert created + first / FPS <= time.time() + 0.5  # and no frame ahead of the clock
    resumed.say(live.speech[:RATE])
    resumed.wait(lambda: resumed.finished, "speech on the other worker")
    assert any(f.speech for f in resumed.frames)
    assert_audio_locked(list(resumed.frames), 2 * RATE // FPS)
    resumed.cut()
    live.client.close_session(session.id)


def test_admission_refuses_a_third_session_and_leaves_the_two_alone(live: Live) -> None:
    wait_until_the_workers_are_empty(live)
    for name in LIVE[1:]:  # one worker of capacity 2 (the previous test killed one; any order works)
        if (
            live.cluster.processes[name].process.poll() is None
            and sum(live.cluster.processes[n].process.poll() is None for n in LIVE) > 1
        ):
            live.cluster.kill(name)
    eventually(
        lambda: len(asyncio.run(live.jobs.live_workers(5.0))) == 1,
        timeout=15,
        what="the dead worker's heartbeat to go stale",
    )
    first, second = live.open(), live.open()
    streams = [Stream(live.client, s) for s in (first, second)]
    for s in streams:
        s.wait(lambda s=s: len(s.frames) > 5, "frames of the two sessions")
    # Without retries: the client package would wait for room as retry-after-ms says (what a backend wants).
    with LiplineClient(live.cluster.gateway_address, timeout=30, retry=NO_RETRY) as once:
        with pytest.raises(grpc.RpcError) as refused:
            once.create_session(live.avatar_id)
    assert (
        refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        and "no live worker has room" in refused.value.details()
    )
    assert int(dict(refused.value.trailing_metadata())["retry-after-ms"]) > 0
    seen = [len(s.frames) for s in streams]
    for s, before in zip(streams, seen):  # unaffected: their frames go on (wait() fails on a stream's error)
        s.wait(lambda s=s, before=before: len(s.frames) > before + 5, "the two sessions' frames going on")
        assert steady(s.frames)
        s.cut()
    for s in (first, second):
        live.client.close_session(s.id)
    third = live.open()  # room again
    live.client.close_session(third.id)


def test_a_draining_worker_hands_its_session_to_another(live: Live) -> None:
    """SIGTERM: the worker ends the stream UNAVAILABLE saying to resume, gives its lease up and
    exits; the resume lands on the other worker."""
    # A worker restarted here is up on its old address while the gateway's channel to it may still be
    # in its reconnect back-off: the resume below can be the gateway's first call to it since.
    for name in LIVE:
        if live.cluster.processes[name].process.poll() is not None:
            live.cluster.restart(name)
    wait_until_the_workers_are_empty(live)
    session = live.open()
    draining = live.worker_of(session.id)
    talk = Stream(live.client, session)
    talk.wait(lambda: len(talk.frames) > 5, "frames")
    stopper = threading.Thread(target=live.cluster.terminate, args=(draining,))
    stopper.start()
    talk.thread.join(20)
    assert (
        talk.error is not None and talk.error.code() == grpc.StatusCode.UNAVAILABLE and "resume" in talk.error.details()
    ), talk.error
    resumed = Stream(live.client, session, last_frame=talk.frames[-1].index)
    resumed.wait(lambda: len(resumed.frames) > 5, "frames from the other worker")
    assert live.worker_of(session.id) != draining and resumed.frames[0].keyframe
    stopper.join(30)
    assert live.cluster.processes[draining].process.poll() is not None  # it exited within its grace
    resumed.cut()
    live.client.close_session(session.id)
