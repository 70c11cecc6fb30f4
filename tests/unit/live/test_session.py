"""LiveSession on a fake clock with a stand-in face generator: real encoders, real mel, real compositor.

The stand-in generator paints the lower face a flat grey whose level follows the mel window's energy,
so a speech frame is visibly not the template there, and an idle frame is the template's own.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from services.live.audio_retime import frames_for_samples
from services.live.clock import NS_PER_S, FrameClock, FrameKind
from services.live.encoders import H264Encoder, JpegEncoder
from services.live.idle import IdleLoop
from services.live.session import EventKind, LiveSession, SpeechFrame
from services.media.composite import Compositor, I420Frames
from services.serving.errors import InvalidMedia, InvalidRequest, TooLarge

AVATAR = Path(__file__).resolve().parents[3] / "samples" / "avatar.jpg"
SIZE = 256
BOX = (80, 96, 176, 208)  # x1, y1, x2, y2: the face box of every template frame
MOUTH = (slice(160, 208), slice(84, 172))  # rows and columns inside the box's regenerated (lower) half
FPS = Fraction(25)
RATE = 16000
STEP = RATE // 50  # 20 ms chunks


class FakeClock:
    def __init__(self) -> None:
        self.t = 7 * NS_PER_S

    def __call__(self) -> int:
        return self.t

    def advance_ms(self, ms: float) -> None:
        self.t += round(ms * 1_000_000)


@pytest.fixture(scope="module")
def template() -> I420Frames:
    """Five frames of the sample avatar, each shifted a little (a head that moves)."""
    base = cv2.resize(cv2.imread(str(AVATAR)), (SIZE, SIZE), interpolation=cv2.INTER_AREA)
    return I420Frames.from_bgr([np.roll(base, shift, axis=1) for shift in range(0, 10, 2)])


def stand_in_face(template_frame: int, window: np.ndarray) -> np.ndarray:
    level = int(np.clip(40 + 40 * (window.mean() + 4), 0, 255))
    return np.full((BOX[3] - BOX[1], BOX[2] - BOX[0], 3), level, np.uint8)


def make_session(
    template: I420Frames, clock: FakeClock, codec: str = "h264", generate=stand_in_face, **kwargs
) -> LiveSession:
    encoder = H264Encoder(SIZE, SIZE, FPS) if codec == "h264" else JpegEncoder(SIZE, SIZE)
    return LiveSession(
        IdleLoop(template),
        Compositor(template, [BOX] * template.count),
        encoder,
        FrameClock(FPS, clock),
        generate,
        RATE,
        **kwargs,
    )


class Recorder:
    """Drives a session in real time: every 20 ms of fake time, the chunk that just ended arrives, then a tick."""

    def __init__(self, session: LiveSession, clock: FakeClock) -> None:
        self.session, self.clock = session, clock
        self.ticks = []

    def step(self, chunk: np.ndarray | None = None, end: bool = False) -> None:
        self.clock.advance_ms(20)
        if chunk is not None:
            self.session.push_audio(chunk.tobytes())
        if end:
            self.session.end_utterance()
        self.tick()

    def tick(self) -> None:
        tick = self.session.tick()
        if tick is not None:
            self.ticks.append(tick)

    def speak(self, pcm: np.ndarray) -> None:
        for i in range(0, len(pcm), STEP):
            self.step(pcm[i : i + STEP], end=i + STEP >= len(pcm))

    def wait(self, ms: int) -> None:
        for _ in range(ms // 20):
            self.step()

    @property
    def events(self) -> list:
        return [e for t in self.ticks for e in t.events]

    def audio_of_frames(self) -> np.ndarray:
        return np.concatenate([a.samples for t in self.ticks for a in t.audio])


def decode_h264(ticks) -> list[np.ndarray]:
    decoder = av.CodecContext.create("h264", "r")
    pictures = []
    for tick in ticks:
        if tick.frame is not None:
            (picture,) = decoder.decode(av.Packet(tick.frame.data))
            pictures.append(cv2.cvtColor(picture.to_ndarray(format="yuv420p"), cv2.COLOR_YUV2BGR_I420))
    return pictures


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 99.0 if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def test_speech_silence_speech_in_real_time(template, speech_pcm) -> None:
    """3 s of speech, 2 s of nothing, 2 s of speech: a frame every 40 ms, consecutive, the mouth moving only in speech."""
    clock = FakeClock()
    session = make_session(template, clock)
    run = Recorder(session, clock)
    first, second = speech_pcm[RATE][: 3 * RATE], speech_pcm[RATE][3 * RATE : 5 * RATE]
    run.speak(first)
    run.wait(2000)
    run.speak(second)
    run.wait(600)
    assert [t.frame.pts for t in run.ticks] == list(range(len(run.ticks)))  # every slot, in order, none skipped
    assert (
        all(not t.skipped for t in run.ticks) and len(run.ticks) == (3000 + 2000 + 2000 + 600) // 40 + 1
    )  # frame 0 at 0 ms
    kinds = [t.kind for t in run.ticks]
    starts = [e.frame for e in run.events if e.kind is EventKind.PLAYBACK_STARTED]
    # The latency floor: frame 0's window needs 212.5 ms of audio; in 20 ms chunks that is there at 220 ms,
    # and the next slot starts at 240 ms: frame 6 (a tick makes its frame at the slot's start).
    assert starts[0] == 6
    speech_frames = frames_for_samples(len(first), RATE, FPS), frames_for_samples(len(second), RATE, FPS)
    assert kinds[: starts[0]] == [FrameKind.IDLE] * starts[0]
    assert kinds[starts[0] : starts[0] + speech_frames[0]] == [FrameKind.SPEECH] * speech_frames[0]
    assert kinds[starts[1] : starts[1] + speech_frames[1]] == [FrameKind.SPEECH] * speech_frames[1]
    assert kinds.count(FrameKind.SPEECH) == sum(speech_frames)
    # Frame j's own audio ends at 40 (j + 1) ms of the utterance and arrives then; the frame is made 200 ms
    # later (the 212.5 ms look-ahead, less the frame's own 40 ms, rounded up to a 20 ms chunk and a slot).
    latencies = {round(t.latency_s, 6) for t in run.ticks if t.kind is FrameKind.SPEECH}
    assert latencies == {0.2} and all(t.latency_s is None for t in run.ticks if t.kind is FrameKind.IDLE)
    assert starts[1] - (starts[0] + speech_frames[0]) >= 2000 // 40 - 1  # the pause is idle
    assert (session.counts.speech, session.counts.idle, session.counts.skipped) == (
        sum(speech_frames),
        len(run.ticks) - sum(speech_frames),
        0,
    )
    # The re-timed audio is the input audio, sample for sample, on the frames that showed it.
    np.testing.assert_array_equal(run.audio_of_frames(), np.concatenate([first, second]))
    assert [(e.kind, e.utterance, e.frame, e.position_ms, e.interrupted) for e in run.events] == [
        (EventKind.PLAYBACK_STARTED, 0, starts[0], 0.0, False),
        (EventKind.PLAYBACK_FINISHED, 0, starts[0] + speech_frames[0], 3000.0, False),
        (EventKind.PLAYBACK_STARTED, 1, starts[1], 0.0, False),
        (EventKind.PLAYBACK_FINISHED, 1, starts[1] + speech_frames[1], 2000.0, False),
    ]
    # The stream decodes; idle frames are the template's own, speech frames are not (in the mouth).
    pictures = decode_h264(run.ticks)
    assert len(pictures) == len(run.ticks)
    idle_loop = IdleLoop(template)
    for k, (picture, kind) in enumerate(zip(pictures, kinds)):
        own = cv2.cvtColor(idle_loop.frame(k), cv2.COLOR_YUV2BGR_I420)
        mouth = psnr(picture[MOUTH], own[MOUTH])
        if kind is FrameKind.IDLE:
            assert mouth > 33, f"idle frame {k}: mouth PSNR {mouth:.1f} dB against the template's"
        else:
            assert mouth < 20, f"speech frame {k}: the mouth is the template's ({mouth:.1f} dB)"
        assert psnr(picture[:80], own[:80]) > 33  # above the box's lower half: always the template


def test_clear_returns_to_idle_within_one_tick(template, speech_pcm) -> None:
    clock = FakeClock()
    session = make_session(template, clock, codec="jpeg")
    run = Recorder(session, clock)
    pcm = speech_pcm[RATE][: 2 * RATE]
    for i in range(0, RATE, STEP):  # 1 s of a 2 s utterance, still open
        run.step(pcm[i : i + STEP])
    played = sum(1 for t in run.ticks if t.kind is FrameKind.SPEECH)
    assert played > 10
    event = session.clear()
    assert event is not None and event.kind is EventKind.PLAYBACK_FINISHED and event.interrupted
    assert (event.utterance, event.position_ms) == (0, played * 40.0)
    run.wait(40)
    assert run.ticks[-1].kind is FrameKind.IDLE and event in run.ticks[-1].events  # the very next frame
    assert session.queue.empty and session.queue.queued_samples == 0
    run.speak(pcm[RATE:])  # the session goes on: a new utterance plays
    run.wait(400)
    assert [e.utterance for e in run.events if e.kind is EventKind.PLAYBACK_STARTED] == [0, 1]
    for tick in run.ticks:
        assert cv2.imdecode(np.frombuffer(tick.frame.data, np.uint8), cv2.IMREAD_COLOR).shape == (SIZE, SIZE, 3)


def test_a_stall_skips_slots_and_speech_goes_on_through_them(template, speech_pcm) -> None:
    """130 ms without a tick in mid-speech: 2 slots skipped, the utterance 3 frames on, its audio whole."""
    clock = FakeClock()
    session = make_session(template, clock)
    run = Recorder(session, clock)
    pcm = speech_pcm[RATE][: 2 * RATE]
    chunks = [pcm[i : i + STEP] for i in range(0, len(pcm), STEP)]
    for chunk in chunks[:40]:
        run.step(chunk)
    before = run.ticks[-1].frame.pts
    clock.advance_ms(130)  # the worker was descheduled; the audio arrived meanwhile
    for chunk in chunks[40:47]:
        session.push_audio(chunk.tobytes())
    run.tick()
    stalled = run.ticks[-1]
    assert stalled.frame.pts - before == len(stalled.skipped) + 1 >= 3
    assert [a.frame for a in stalled.audio] == [*stalled.skipped, stalled.frame.pts]
    assert session.counts.skipped == len(stalled.skipped)
    for i, chunk in enumerate(chunks[47:], start=47):
        run.step(chunk, end=i == len(chunks) - 1)
    run.wait(400)
    np.testing.assert_array_equal(run.audio_of_frames(), pcm)  # nothing of the audio lost to the skip
    assert len(decode_h264(run.ticks)) == len(run.ticks)  # the stream decodes across the gap


def test_a_frame_finished_after_its_slot_is_dropped_before_encoding(template, speech_pcm) -> None:
    clock = FakeClock()
    calls = []

    def slow_generator(template_frame: int, window: np.ndarray) -> np.ndarray:
        calls.append(template_frame)
        if len(calls) == 10:
            clock.advance_ms(45)  # the stage answered past the slot's end
        return stand_in_face(template_frame, window)

    session = make_session(template, clock, generate=slow_generator)
    run = Recorder(session, clock)
    run.speak(speech_pcm[RATE][: RATE // 2])
    run.wait(400)
    dropped = [t for t in run.ticks if t.frame is None]
    assert len(dropped) == 1 and dropped[0].kind is FrameKind.SPEECH and dropped[0].audio
    assert session.counts.skipped >= 1
    pts = [t.frame.pts for t in run.ticks if t.frame is not None]
    assert pts == sorted(set(pts))
    assert len(decode_h264(run.ticks)) == len(pts)  # the dropped frame was never encoded: no broken reference


def test_an_utterance_waits_in_idle_when_its_audio_is_late(template, speech_pcm) -> None:
    clock = FakeClock()
    session = make_session(template, clock)
    run = Recorder(session, clock)
    pcm = speech_pcm[RATE][: 2 * RATE]
    chunks = [pcm[i : i + STEP] for i in range(0, len(pcm), STEP)]
    for chunk in chunks[:50]:
        run.step(chunk)
    run.wait(600)  # the client stalls, the utterance stays open
    kinds = [t.kind for t in run.ticks]
    assert kinds[-5:] == [FrameKind.IDLE] * 5
    for i, chunk in enumerate(chunks[50:], start=50):
        run.step(chunk, end=i == len(chunks) - 1)
    run.wait(400)
    np.testing.assert_array_equal(run.audio_of_frames(), pcm)  # it resumed where it stopped
    assert sum(1 for t in run.ticks if t.kind is FrameKind.SPEECH) == frames_for_samples(len(pcm), RATE, FPS)
    assert [e.kind for e in run.events] == [EventKind.PLAYBACK_STARTED, EventKind.PLAYBACK_FINISHED]


def test_bad_input_is_refused_and_changes_nothing(template) -> None:
    clock = FakeClock()
    session = make_session(template, clock, max_queued_seconds=0.5)
    with pytest.raises(InvalidMedia, match="even byte count"):
        session.push_audio(b"\x01\x02\x03")
    with pytest.raises(InvalidRequest, match="10-100 ms"):
        session.push_audio(np.zeros(RATE // 5, np.int16).tobytes())
    for _ in range(5):
        session.push_audio(np.zeros(RATE // 10, np.int16).tobytes())
    with pytest.raises(TooLarge, match="real time"):
        session.push_audio(np.zeros(STEP, np.int16).tobytes())
    assert session.queue.queued_samples == RATE // 2
    with pytest.raises(InvalidMedia, match="44100"):
        LiveSession(
            IdleLoop(template),
            Compositor(template, [BOX] * template.count),
            JpegEncoder(SIZE, SIZE),
            FrameClock(FPS, clock),
            stand_in_face,
            44100,
        )
    assert session.end_utterance() == 0 and session.end_utterance() is None


class Ticket:
    """A face asked for ahead of its slot, answered when the test says (what the FaceLink's future does)."""

    def __init__(self, face: np.ndarray, asked_ns: int, due_ns: int) -> None:
        self.face, self.asked_ns, self.due_ns = face, asked_ns, due_ns
        self.answered = False
        self.cancelled = False
        self.given_up = False  # the session cancelled it (a done ticket stays done, as a future does)

    def done(self) -> bool:
        return self.answered or self.cancelled

    def result(self) -> np.ndarray:
        if self.cancelled:
            raise RuntimeError("cancelled")
        return self.face

    def cancel(self) -> bool:
        self.given_up = True
        self.cancelled = not self.answered
        return self.cancelled


class Stage:
    """Answers every ticket `delay_ms` after it was asked for (as the clock advances), except those in `never`."""

    def __init__(self, clock: FakeClock, delay_ms: float = 30.0) -> None:
        self.clock, self.delay_ns = clock, round(delay_ms * 1e6)
        self.tickets: dict[int, Ticket] = {}
        self.never: set[int] = set()

    def submit(self, frame: int, template_frame: int, speech: SpeechFrame, due_ns: int) -> Ticket:
        ticket = Ticket(stand_in_face(template_frame, speech.mel), self.clock.t, due_ns)
        self.tickets[frame] = ticket
        return ticket

    def answer(self) -> None:
        for frame, ticket in self.tickets.items():
            if frame not in self.never and not ticket.cancelled and self.clock.t - ticket.asked_ns >= self.delay_ns:
                ticket.answered = True


class StageRecorder(Recorder):
    def __init__(self, session: LiveSession, clock: FakeClock, stage: Stage) -> None:
        super().__init__(session, clock)
        self.stage = stage

    def tick(self) -> None:
        self.stage.answer()
        super().tick()


def lead_session(template: I420Frames, clock: FakeClock, stage: Stage, codec: str = "h264") -> LiveSession:
    return make_session(template, clock, codec=codec, generate=None, submit_face=stage.submit, lead_s=0.08)


def test_with_a_lead_faces_are_asked_for_ahead_of_their_slots(template, speech_pcm) -> None:
    """A worker's way: each speech frame's face is asked for >= 80 ms before its slot, and used at the slot."""
    clock = FakeClock()
    stage = Stage(clock, delay_ms=30)
    session = lead_session(template, clock, stage)
    run = StageRecorder(session, clock, stage)
    pcm = speech_pcm[RATE][: 2 * RATE]
    run.speak(pcm)
    run.wait(600)
    speech = [t for t in run.ticks if t.kind is FrameKind.SPEECH]
    assert len(speech) == frames_for_samples(len(pcm), RATE, FPS) and all(t.frame is not None for t in speech)
    assert [t.frame.pts for t in run.ticks] == list(range(len(run.ticks)))  # consecutive: nothing skipped
    assert all(ticket.due_ns - ticket.asked_ns >= 80_000_000 for ticket in stage.tickets.values())
    assert sorted(stage.tickets) == [t.frame.pts for t in speech]  # one face per speech frame, at its own slot
    assert speech[-1].frame.pts - speech[0].frame.pts == len(speech) - 1  # the utterance on consecutive frames
    np.testing.assert_array_equal(run.audio_of_frames(), pcm)
    latencies = {round(t.latency_s, 6) for t in speech}
    assert min(latencies) >= 0.28  # 200 ms (the mel's look-ahead, as without a lead) + the 80 ms lead
    pictures = decode_h264(run.ticks)
    for picture, tick in zip(pictures, run.ticks):
        own = cv2.cvtColor(IdleLoop(template).frame(tick.frame.pts), cv2.COLOR_YUV2BGR_I420)
        assert (psnr(picture[MOUTH], own[MOUTH]) < 20) == (tick.kind is FrameKind.SPEECH)


def test_a_face_not_back_at_its_slot_skips_that_frame_only(template, speech_pcm) -> None:
    clock = FakeClock()
    stage = Stage(clock, delay_ms=30)
    session = lead_session(template, clock, stage)
    run = StageRecorder(session, clock, stage)
    stage.never = {15}
    pcm = speech_pcm[RATE][:RATE]
    run.speak(pcm)
    run.wait(600)
    (skipped,) = [t for t in run.ticks if t.frame is None]
    assert skipped.kind is FrameKind.SPEECH and skipped.slot == 15 and skipped.audio
    assert stage.tickets[15].cancelled and session.counts.skipped == 1
    np.testing.assert_array_equal(run.audio_of_frames(), pcm)  # its audio still went out
    assert len(decode_h264(run.ticks)) == len(run.ticks) - 1  # never encoded: the next frames decode


def test_within_the_grace_a_late_face_is_waited_for_and_used(template, speech_pcm) -> None:
    """With face_grace_s, a face not back at its slot's start is pending: back within the grace, the frame
    is drawn with it (not skipped); still missing when the caller gives up, the frame is skipped."""
    clock = FakeClock()
    stage = Stage(clock, delay_ms=30)
    session = make_session(
        template, clock, codec="jpeg", generate=None, submit_face=stage.submit, lead_s=0.04, face_grace_s=0.02
    )
    stage.never = {9, 12}
    pcm = speech_pcm[RATE][: RATE // 2]
    for i in range(0, len(pcm), STEP):
        session.push_audio(pcm[i : i + STEP].tobytes())
    session.end_utterance()
    sent, skipped = [], []
    for _ in range(60):
        clock.advance_ms(10)
        stage.answer()
        work = session.begin_tick()
        if work is None:
            continue
        if work.pending is not None:
            assert work.frame in stage.never and not work.pending.done()
            if work.frame == 9:  # back 5 ms into its slot, within the grace
                clock.advance_ms(5)
                stage.tickets[9].answered = True
            session.settle(work)
        tick = session.render(work)
        (sent if tick.frame is not None else skipped).append(tick)
    assert [t.slot for t in skipped] == [12] and stage.tickets[12].given_up
    late = next(t for t in sent if t.slot == 9)
    assert late.kind is FrameKind.SPEECH and late.frame is not None
    assert session.counts.skipped == session.counts.skipped_face == 1 and session.face_failures == 0


def test_clear_drops_the_planned_frames_and_says_what_played(template, speech_pcm) -> None:
    clock = FakeClock()
    stage = Stage(clock, delay_ms=30)
    session = lead_session(template, clock, stage, codec="jpeg")
    run = StageRecorder(session, clock, stage)
    pcm = speech_pcm[RATE][: 2 * RATE]
    for i in range(0, RATE, STEP):
        run.step(pcm[i : i + STEP])
    shown = sum(1 for t in run.ticks if t.kind is FrameKind.SPEECH)
    planned = [ticket for frame, ticket in stage.tickets.items() if frame > run.ticks[-1].slot]
    assert planned, "with a lead, frames ahead of the clock are planned"
    event = session.clear()
    assert event is not None and event.interrupted and event.position_ms == shown * 40.0
    assert all(ticket.given_up for ticket in planned)
    run.wait(40)
    assert run.ticks[-1].kind is FrameKind.IDLE and event in run.ticks[-1].events
    run.wait(200)
    assert all(t.kind is FrameKind.IDLE for t in run.ticks[-5:]) and not session.playing


def test_with_a_lead_a_stall_mid_utterance_plays_on_through_the_slots_passed(template, speech_pcm) -> None:
    """The worker descheduled past its planned frames, the audio there: no idle pause in the utterance."""
    clock = FakeClock()
    stage = Stage(clock, delay_ms=30)
    session = lead_session(template, clock, stage)
    run = StageRecorder(session, clock, stage)
    pcm = speech_pcm[RATE][: 2 * RATE]
    chunks = [pcm[i : i + STEP] for i in range(0, len(pcm), STEP)]
    for chunk in chunks[:40]:
        run.step(chunk)
    clock.advance_ms(200)  # longer than the lead: the planned frames pass unsent
    for chunk in chunks[40:50]:
        session.push_audio(chunk.tobytes())
    run.tick()
    for i, chunk in enumerate(chunks[50:], start=50):
        run.step(chunk, end=i == len(chunks) - 1)
    run.wait(600)
    speech_slots = sorted({a.frame for t in run.ticks for a in t.audio})
    assert speech_slots == list(range(speech_slots[0], speech_slots[0] + len(speech_slots))), (
        "the utterance's frames are consecutive slots"
    )
    assert len(speech_slots) == frames_for_samples(len(pcm), RATE, FPS)
    np.testing.assert_array_equal(run.audio_of_frames(), pcm)
    assert session.counts.skipped >= 5  # the stall's slots, and the frames right after it whose faces came too late
    assert len(decode_h264(run.ticks)) == sum(1 for t in run.ticks if t.frame is not None)
