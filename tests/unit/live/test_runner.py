"""SessionRunner's side of the wire: frames with their re-timed audio (skipped slots' included), events
numbered from 1, a slow reader's frames dropped and the next one a keyframe. A real LiveSession on a
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


def make_runner(session, queue_frames: int = 100) -> SessionRunner:  # type: ignore[no-untyped-def]
    proto = session_pb2.Session(
        id="s1", limits=session_pb2.SessionLimits(max_session_seconds=60, idle_timeout_seconds=60)
    )
    pool = concurrent.futures.ThreadPoolExecutor(1)
    return SessionRunner("s1", "acme", proto, session, pool, Metrics("live"), queue_frames, lambda runner: None)


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


def test_a_full_send_queue_drops_frames_and_the_next_is_a_keyframe(template) -> None:  # noqa: F811
    clock = FakeClock()
    session = make_session(template, clock)
    runner = make_runner(session, queue_frames=3)

    async def attach():
        return runner.attach()

    stream = asyncio.run(attach())
    for _ in range(8):  # nobody reads
        clock.advance_ms(40)
        runner.deliver(session.tick(), stream)
    assert runner.dropped == 5 and stream.dropped == 5
    frames = [m.frame for m in drain(stream) if m.WhichOneof("response") == "frame"]
    assert [f.index for f in frames] == [1, 2, 3] and frames[0].keyframe
    clock.advance_ms(40)
    runner.deliver(session.tick(), stream)
    (after,) = [m.frame for m in drain(stream) if m.WhichOneof("response") == "frame"]
    assert after.index == 9 and after.keyframe  # the reference chain starts again
    runner.end(session_pb2.SESSION_STATE_CLOSED, "closed", grpc.StatusCode.OK)
    assert stream.closed and runner.ended
