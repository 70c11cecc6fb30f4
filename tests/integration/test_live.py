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
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from lipline.v1 import session_pb2
from lipline_client import NO_RETRY
from services.gateway.client import LiplineClient
from services.gateway.live_client import frame_audio, pcm_chunks, pcm_of_audio, run_session, write_mp4
from services.jobs.store import open_job_store
from services.jobs.store.jobs import JobStore
from services.jobs.store.sessions import SessionRow
from services.local.cluster import LocalCluster
from services.media.probe import probe_media
from tests.integration.util import SAMPLES, cut_wav, eventually, silent_frames_between, start_cluster

RATE, FPS = 16000, 25
LIVE = ("live", "live-1")


@dataclass
class Live:
    cluster: LocalCluster
    client: LiplineClient
    jobs: JobStore
    avatar_id: str
    speech: bytes  # PCM s16le mono at RATE

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
                elif kind == "event" and response.event.kind == session_pb2.SessionEvent.PLAYBACK_FINISHED:
                    self.finished += 1
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
    """Indices that only grow, one by one but for a few slots skipped (counted by the worker) when a
    loaded 2-core machine descheduled it (the suite runs 4 test workers on CI's 2 cores): a late frame
    is skipped, never delayed. On the GPU host 100 sessions skip 0-2 % of frames (docs/performance.md)."""
    indices = [f.index for f in frames]
    gaps = sum(b - a - 1 for a, b in zip(indices, indices[1:]))
    return all(b > a for a, b in zip(indices, indices[1:])) and gaps <= max(5, 0.08 * len(indices))


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
        gaps <= recorder.stats[-1].frames_skipped + recorder.stats[-1].frames_dropped + 1
    )  # every gap counted (the last stats may precede one)
    # The re-timed audio is the input, sample for sample, from the frame the utterance started at.
    (started,) = [e.frame for e in recorder.events if e.kind == session_pb2.SessionEvent.PLAYBACK_STARTED]
    track, span = frame_audio(recorder), 2 * RATE // FPS
    pauses = silent_frames_between(track[(started - frames[0].index) * span :], live.speech, span)
    assert pauses <= 0.1 * len(live.speech) / span, f"the utterance paused for {pauses} frames"
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
    session = live.client.create_session(live.avatar_id)
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
    session = live.client.create_session(live.avatar_id)
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


def test_a_killed_worker_loses_its_session_to_the_other(live: Live) -> None:
    session = live.client.create_session(live.avatar_id)
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
    # Audio and video stay locked: every frame carries its slot's audio (and that of any slot skipped
    # just before it), so the audio received covers exactly the slots from the first frame to the last.
    frames = list(resumed.frames)
    audio = sum(len(f.audio) for f in frames) // 2
    assert audio == (frames[-1].index - frames[0].index + 1) * RATE // FPS
    resumed.cut()
    live.client.close_session(session.id)


def test_admission_refuses_a_third_session_and_leaves_the_two_alone(live: Live) -> None:
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
    first, second = live.client.create_session(live.avatar_id), live.client.create_session(live.avatar_id)
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
    time.sleep(0.5)
    for s, before in zip(streams, seen):
        assert s.error is None and len(s.frames) > before and steady(s.frames)  # unaffected
        s.cut()
    for s in (first, second):
        live.client.close_session(s.id)
    third = live.client.create_session(live.avatar_id)  # room again
    live.client.close_session(third.id)


def test_a_draining_worker_hands_its_session_to_another(live: Live) -> None:
    """SIGTERM: the worker ends the stream UNAVAILABLE saying to resume, gives its lease up and
    exits; the resume lands on the other worker."""
    for name in LIVE:
        if live.cluster.processes[name].process.poll() is not None:
            live.cluster.restart(name)
    session = live.client.create_session(live.avatar_id)
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
