"""SessionRunner's side of the wire: frames with their re-timed audio (skipped slots' included), events
numbered from 1, a slow reader's oldest frames dropped (it gets the live edge) and H.264 restarted at a
keyframe. A real LiveSession on a
fake clock feeds it, as the pacing task does; its SendQueue is what the Converse writer sends."""

from __future__ import annotations

import asyncio
import concurrent.futures

import grpc
import numpy as np

from lipline.v1 import session_pb2
from services.live.runner import SessionRunner
from services.serving.metrics import Metrics
from tests.unit.live.test_session import RATE, STEP, FakeClock, Stage, lead_session, make_session, template  # noqa: F401 - template is a fixture


def make_runner(session, queue_frames: int = 100, send_lag_s: float | None = None) -> SessionRunner:  # type: ignore[no-untyped-def]
    proto = session_pb2.Session(
        id="s1", limits=session_pb2.SessionLimits(max_session_seconds=60, idle_timeout_seconds=60)
    )
    pool = concurrent.futures.ThreadPoolExecutor(1)
    return SessionRunner(
        "s1", "acme", proto, session, pool, Metrics("live"), queue_frames, lambda runner: None, send_lag_s=send_lag_s
    )


def drain(stream) -> list:  # type: ignore[no-untyped-def]
    async def take() -> list:
        out = []
        while len(stream):
            out.append((await stream.get())[0])
        return out

    return asyncio.run(take())


def test_frames_carry_the_audio_of_the_slots_skipped_before_them(template, speech_pcm) -> None:  # noqa: F811
    """Two ways a slot goes unsent: the worker stalled (the clock skips), a face was not back (the tick has no frame)."""
    clock = FakeClock()
    stage = Stage(clock)
    session = lead_session(template, clock, stage, codec="jpeg")
    runner = make_runner(session)

    async def attach():  # a SendQueue belongs to a running loop's task
        return runner.attach()

    stream = asyncio.run(attach())
    stage.never = {14}
    pcm = speech_pcm[RATE][:RATE]
    for i in range(0, len(pcm) + 30 * STEP, STEP):
        clock.advance_ms(20)
        if i < len(pcm):
            session.push_audio(pcm[i : i + STEP].tobytes())
        if i == len(pcm) - STEP:
            session.end_utterance()
        if i == 30 * STEP:
            clock.advance_ms(130)  # a stall: slots skipped
        stage.answer()
        tick = session.tick()
        if tick is not None:
            runner.deliver(tick, stream)
    messages = drain(stream)
    frames = [m.frame for m in messages if m.WhichOneof("response") == "frame"]
    assert session.counts.skipped >= 3 and frames[-1].index + 1 - len(frames) == session.counts.skipped
    assert 14 not in {f.index for f in frames}
    track = np.frombuffer(b"".join(f.audio for f in frames), "<i2")
    assert len(track) == (frames[-1].index + 1) * RATE // 25  # every slot's audio, sent or skipped
    events = [m.event for m in messages if m.WhichOneof("response") == "event"]
    (started,) = [e for e in events if e.kind == session_pb2.SessionEvent.PLAYBACK_STARTED]
    # The audio of the slots passed (frame 14's, the stall's) went with the next speech frame: the
    # speech frames' audio is the utterance (its audio was late after the stall: idle frames waited).
    np.testing.assert_array_equal(np.frombuffer(b"".join(f.audio for f in frames if f.speech), "<i2"), pcm)
    assert not track[: started.frame * RATE // 25].any()
    assert started.utterance == 1 and {f.utterance for f in frames if f.speech} == {1}
    assert any(m.WhichOneof("response") == "stats" for m in messages)


def test_an_utterance_ending_inside_a_slot_is_filled_with_silence_to_the_slots_end(template, speech_pcm) -> None:  # noqa: F811
    """The audio a client concatenates is exactly as long as the frames: the last frame of an
    utterance whose input ends inside its slot carries that input, then silence to the slot's end."""
    clock = FakeClock()
    session = make_session(template, clock, codec="jpeg")
    runner = make_runner(session)

    async def attach():
        return runner.attach()

    stream = asyncio.run(attach())
    pcm = speech_pcm[RATE][: RATE // 2 + 100]  # 12 slots of 640 samples, and 100 more
    for i in range(0, len(pcm) + 20 * STEP, STEP):
        clock.advance_ms(20)
        if i < len(pcm):
            session.push_audio(pcm[i : i + STEP].tobytes())
            if i + STEP >= len(pcm):
                session.end_utterance()
        tick = session.tick()
        if tick is not None:
            runner.deliver(tick, stream)
    frames = [m.frame for m in drain(stream) if m.WhichOneof("response") == "frame"]
    assert all(len(f.audio) == 2 * RATE // 25 for f in frames[1:])  # every slot whole (nothing skipped here)
    track = np.frombuffer(b"".join(f.audio for f in frames), "<i2")
    assert len(track) == (frames[-1].index - frames[0].index + 1) * RATE // 25
    speech = np.frombuffer(b"".join(f.audio for f in frames if f.speech), "<i2")
    assert len(speech) == 13 * 640 and sum(f.speech for f in frames) == 13
    np.testing.assert_array_equal(speech[: len(pcm)], pcm)
    assert not speech[len(pcm) :].any()


def unread(runner: SessionRunner, session, clock: FakeClock, stream, ticks: int) -> None:  # type: ignore[no-untyped-def]
    """`ticks` frames made as the pacing task makes them (room first, then the frame), nobody reading."""
    for _ in range(ticks):
        clock.advance_ms(40)
        work = session.begin_tick()
        runner.make_room(stream, work.frame)
        runner.deliver(session.render(session.settle(work)), stream)


def test_a_reader_that_stops_loses_the_oldest_frames_and_h264_restarts_at_a_keyframe(template) -> None:  # noqa: F811
    clock = FakeClock()
    session = make_session(template, clock)
    runner = make_runner(session, queue_frames=3)

    async def attach():
        return runner.attach()

    stream = asyncio.run(attach())
    unread(runner, session, clock, stream, 8)
    # Frames 1 (an IDR), 2, 3 queued; frame 4 finds the queue full: 1 goes, and 2 and 3 with it (they
    # refer to it), so 4 is made an IDR; 5, 6; then 7 the same. Nothing is lost to a broken chain.
    assert runner.dropped == 6 and stream.dropped == 6
    assert runner.metrics.registry.get_sample_value("lipline_live_frames_total", {"kind": "dropped"}) == 6
    frames = [m.frame for m in drain(stream) if m.WhichOneof("response") == "frame"]
    assert [(f.index, f.keyframe) for f in frames] == [(7, True), (8, False)]
    assert [len(f.audio) for f in frames] == [2 * RATE // 25] * 2  # each its own slot's audio: the gap is in both
    lumas = decode_h264([f.data for f in frames])  # a decoder starts at the live edge
    assert len(lumas) == 2
    runner.end(session_pb2.SESSION_STATE_CLOSED, "closed", grpc.StatusCode.OK)
    assert stream.closed and runner.ended and stream.frames == 0  # what was queued went with the session


def test_a_reader_behind_by_more_than_the_lag_gets_the_live_edge(template) -> None:  # noqa: F811
    """JPEG (every frame a keyframe), a lag of 0.1 s (3 frames at 25 fps): the newest frames are kept."""
    clock = FakeClock()
    session = make_session(template, clock, codec="jpeg")
    runner = make_runner(session, queue_frames=100, send_lag_s=0.1)

    async def attach():
        return runner.attach()

    stream = asyncio.run(attach())
    unread(runner, session, clock, stream, 10)
    frames = [m.frame for m in drain(stream) if m.WhichOneof("response") == "frame"]
    assert [f.index for f in frames] == [7, 8, 9, 10] and all(f.keyframe for f in frames)
    assert runner.dropped == 6  # the stats' frames_dropped (tests/integration/test_live.py reads them)


def decode_h264(units: list[bytes]) -> list:
    import av

    decoder = av.CodecContext.create("h264", "r")
    out = []
    for packet in [*(av.Packet(u) for u in units), None]:
        out += [p.to_ndarray(format="gray") for p in decoder.decode(packet)]
    return out
