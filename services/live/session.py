"""One live session as a plain object: PCM chunks in, per tick one encoded frame, its audio and events out.

This ties the building blocks together without gRPC, threads or a GPU, so that the rules can be tested
on a fake clock (`tests/unit/live/test_session.py`); a live worker drives it from its tick loop:

* `push_audio` appends a chunk to the open utterance: its samples go to the speech queue
  (`audio_retime.SpeechQueue`: bounded, re-timed to frames) and to the utterance's incremental mel
  (`mel_stream.MelStream`); `end_utterance` closes it (the mel's tail windows are made then).
* `tick` asks the clock (`clock.FrameClock`) for the frame due now. Frame k shows template frame
  ``idle.template_frame(k)``; when the head utterance's next frame has both its samples and its mel
  window, it is a speech frame: the face generator (the lipsync stage in a worker, a function here)
  makes the mouth from the window and the compositor pastes it; otherwise the idle frame plays (the
  template's own, nothing computed). Then the frame is encoded (`encoders`).
* With a lead (`lead_s` > 0, a worker: the face comes from the lipsync stage through the FaceLink),
  a speech frame is planned as soon as its window exists: it gets the first slot at least `lead_s`
  ahead (or the slot after the utterance's previous frame, so an utterance plays on consecutive
  frames) and its face is asked for at once (`FaceSubmitter`, due at the slot's time). At the slot the
  face is used if it is back, else the frame is skipped (counted; its audio still goes out). A tick
  is then two steps: `begin_tick` on the thread that owns the session (the worker's event loop: it
  reads the faces' futures) and `render` (composite and encode: a thread pool), `tick` both at once.
* Late frames are skipped, never delayed: slots that passed unsent are skipped by the clock, and
  while speech plays, the utterance advances through them too (their audio is still returned, with
  their timestamps, so the audio track has no hole and stays locked to the frames); a frame whose slot
  ends before it is encoded is dropped before the encoder sees it (an H.264 frame encoded and not
  sent would break the reference chain of the frames after it).
* An utterance whose next window is not there yet (the client sends slower than real time) waits:
  idle frames play meanwhile and the utterance resumes where it was.
* `clear` (barge-in) empties the queue and the mel; the next tick is idle; the event
  PLAYBACK_FINISHED(interrupted) says how far the utterance had played.
* A session of the musetalk tier (docs/architecture.md section 12.7) also feeds each utterance to its
  `features` (the whisper stream: a frame is ready once its window's audio has arrived too, and the
  submitter gets the stream with the frame, `SpeechFrame`) and gates the generated mouth by a causal
  speech envelope (`gate`): a frame it shuts asks for no face and shows the template's mouth, the
  others are blended in proportion (`FrameWork.weight`).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Callable
from typing import Protocol

import numpy as np

from services.live.audio_retime import SpeechQueue, frame_start_sample
from services.live.clock import NS_PER_S, FrameClock, FrameCounts, FrameKind
from services.live.encoders import EncodedFrame, FrameEncoder
from services.live.idle import IdleLoop
from services.live.mel_stream import PCM_SCALE, MelStream, check_sample_rate, pcm_int16
from services.media.composite import Compositor
from services.media.speech import StreamingEnvelope
from services.serving.errors import InvalidRequest

#: (template frame, mel window (80, 16) float32) -> the generated face, BGR at the frame's box size, or
#: None when that template frame has no face (it passes through).
FaceGenerator = Callable[[int, np.ndarray], np.ndarray | None]


class UtteranceFeatures(Protocol):
    """A tier's own audio features of one utterance, made as its speech arrives (the musetalk tier's
    `services.live.whisper_stream.WhisperStream`)."""

    def push(self, samples: np.ndarray) -> None: ...

    def finish(self) -> None: ...

    def ready(self, frame: int) -> bool:
        """Whether frame `frame` of the utterance has what its features need."""
        ...


@dataclasses.dataclass(frozen=True)
class SpeechFrame:
    """What a speech frame's face is made from: its Wav2Lip mel window, and for a tier with features
    of its own the utterance's features and the frame's index in the utterance."""

    mel: np.ndarray  # (80, 16) float32
    index: int = 0
    features: UtteranceFeatures | None = None


class FaceTicket(Protocol):
    """A face asked for ahead of its slot (an asyncio.Future of the FaceLink is one)."""

    def done(self) -> bool: ...

    def result(self) -> np.ndarray | None:
        """The face (None: the template frame has no face); raises when it failed (late, stage error)."""
        ...

    def cancel(self) -> bool: ...


#: (session frame, template frame, its speech, due time in ns on the session's clock) -> its face's ticket
FaceSubmitter = Callable[[int, int, SpeechFrame, int], FaceTicket]


class MadeFace:
    """A face made at once by a FaceGenerator (no lead: the unit tests' and a plain generator's way)."""

    def __init__(self, face: np.ndarray | None) -> None:
        self._face = face

    def done(self) -> bool:
        return True

    def result(self) -> np.ndarray | None:
        return self._face

    def cancel(self) -> bool:
        return False


MAX_CHUNK_MS = 100  # the API's chunk limit (10-100 ms): larger chunks make the latency jumpy


class EventKind(enum.Enum):
    PLAYBACK_STARTED = "playback_started"
    PLAYBACK_FINISHED = "playback_finished"


@dataclasses.dataclass(frozen=True)
class Event:
    """An utterance started or finished playing; position: ms of it played (its length when finished normally)."""

    kind: EventKind
    utterance: int
    frame: int  # the session frame it happened on (the first frame shown, or the one after the last)
    position_ms: float = 0.0
    interrupted: bool = False


@dataclasses.dataclass(frozen=True)
class TimedAudio:
    """Re-timed input audio: ``samples`` (int16 at the session's rate) start at session frame ``frame``."""

    frame: int
    samples: np.ndarray


@dataclasses.dataclass(frozen=True)
class Tick:
    """What one tick sends: the frame (None when its slot ended before it could be encoded), audio, events."""

    frame: EncodedFrame | None
    kind: FrameKind
    audio: list[TimedAudio]
    events: list[Event]
    skipped: range  # slots before this one that passed unsent
    latency_s: float | None = None  # speech: the frame's own audio arrived -> the frame made (the latency figure)
    utterance: int | None = None  # the utterance a speech frame shows
    slot: int = -1  # the session frame of this tick (sent or not)


@dataclasses.dataclass
class _Planned:
    """A speech frame given its slot: its audio and events go out with the tick of that slot."""

    frame: int
    utterance: int
    index: int  # of the frame within its utterance
    audio: TimedAudio
    events: list[Event]
    arrived_ns: int
    face: FaceTicket | None  # None: a slot skipped while it played (only its audio goes out)
    weight: float = 1.0  # the gate's blend weight of its face


@dataclasses.dataclass
class FrameWork:
    """One tick between `begin_tick` and `render`: what to draw for the slot, or that it is skipped."""

    frame: int
    kind: FrameKind
    template: int
    face: np.ndarray | None
    audio: list[TimedAudio]
    events: list[Event]
    skipped: range
    arrived_ns: int | None
    utterance: int | None
    skip: bool = False  # the face was not back in time (or failed): nothing is drawn nor sent
    #: a face not back at the slot's start, still within the session's grace: the caller may wait for
    #: it (at most `LiveSession.grace_s`, inside the slot), then `settle` reads it or skips the frame
    pending: FaceTicket | None = None
    weight: float = 1.0  # how much of the face is blended in (the gate's; 1 without one)


class LiveSession:
    """A session's state and rules; `push_audio`, `end_utterance`, `clear` and `begin_tick` are called
    from one thread (the worker's event loop), `render` from one thread at a time after `begin_tick`.

    Args:
        idle: the avatar's idle loop (its I420 frames and loop mode).
        compositor: pastes a generated face into a template frame (the avatar's boxes).
        encoder: the session's per-frame encoder.
        clock: the session's frame clock (its fps is the session's).
        generate_face: the face generator (see `FaceGenerator`), used when no `submit_face` is given.
        sample_rate: the input PCM's rate (16000, 24000 or 48000).
        max_queued_seconds: the bound on queued, unplayed speech (backpressure).
        submit_face: asks for a frame's face ahead of its slot (the worker's FaceLink).
        lead_s: how far ahead of its slot a speech frame is planned; 0: at its slot (a FaceGenerator).
        face_grace_s: how long past its slot's start a frame may wait for a face not back yet (the
            frame is then sent that much later within its slot, instead of skipped); 0: never wait.
        max_chunk_ms: the longest chunk `push_audio` takes.
        scale: the output frame from the compositor's (the session's size, when it is not the avatar's).
        features: makes an utterance's tier features (`UtteranceFeatures`), one per utterance; None:
            the Wav2Lip window alone.
        gate: the causal speech envelope that gates the generated mouth (reset by `clear`); None: every
            speech frame asks for its face.
    """

    def __init__(
        self,
        idle: IdleLoop,
        compositor: Compositor,
        encoder: FrameEncoder,
        clock: FrameClock,
        generate_face: FaceGenerator | None,
        sample_rate: int,
        max_queued_seconds: float = 10.0,
        submit_face: FaceSubmitter | None = None,
        lead_s: float = 0.0,
        max_chunk_ms: int = MAX_CHUNK_MS,
        scale: Callable[[np.ndarray], np.ndarray] | None = None,
        face_grace_s: float = 0.0,
        features: Callable[[], UtteranceFeatures] | None = None,
        gate: StreamingEnvelope | None = None,
    ) -> None:
        self.idle = idle
        self.compositor = compositor
        self.encoder = encoder
        self.clock = clock
        if submit_face is None:
            if generate_face is None:
                raise ValueError("a session needs a face generator or a face submitter")
            generator = generate_face
            submit_face = lambda frame, template, speech, due: MadeFace(generator(template, speech.mel))  # noqa: E731
        self.submit_face = submit_face
        self.sample_rate = sample_rate
        check_sample_rate(sample_rate)  # before any audio, not at the first chunk
        self.lead_ns = round(lead_s * NS_PER_S)
        self.grace_s = face_grace_s
        self.max_chunk_ms = max_chunk_ms
        self.scale = scale
        self.queue = SpeechQueue(sample_rate, clock.fps, max_samples=round(max_queued_seconds * sample_rate))
        self.make_features = features
        self.gate = gate
        self._features: dict[int, UtteranceFeatures] = {}  # queued utterances' tier features
        self._mel: dict[int, MelStream] = {}  # open utterances' mel streams
        self._windows: dict[int, collections.deque[np.ndarray]] = {}  # ready windows of queued utterances
        # per queued utterance, (samples received after a chunk, when it arrived in ns): the latency's start
        self._arrivals: dict[int, collections.deque[tuple[int, int]]] = {}
        self._received: dict[int, int] = {}
        self._pending_events: list[Event] = []
        self._planned: collections.deque[_Planned] = collections.deque()  # speech frames given a slot, in slot order
        self._plan_next = 0  # the slot after the last planned speech frame
        self.face_failures = 0  # planned faces that failed (late, a stage error): their frames were skipped
        self.last_face_error: BaseException | None = None

    @property
    def counts(self) -> FrameCounts:
        """Frames so far by kind: speech, idle, skipped."""
        return self.clock.counts

    @property
    def queued_seconds(self) -> float:
        """Speech received and not yet given a frame (the backpressure figure)."""
        return self.queue.queued_samples / self.sample_rate

    def push_audio(self, pcm: bytes) -> int:
        """Appends an s16le chunk to the open utterance; returns its id.

        Raises:
            InvalidMedia: an odd byte count. InvalidRequest: a chunk over `max_chunk_ms`.
            NoCapacity: the speech queue's bound (RESOURCE_EXHAUSTED with `retry-after-ms`; the chunk is
                dropped whole, nothing else changes).
        """
        samples = pcm_int16(pcm)
        if len(samples) * 1000 > self.max_chunk_ms * self.sample_rate:
            ms = 1000 * len(samples) / self.sample_rate
            raise InvalidRequest(
                f"audio chunk of {ms:.0f} ms ({len(pcm)} bytes at {self.sample_rate} Hz): send chunks of 10-{self.max_chunk_ms} ms"
            )
        utterance = self.queue.push(samples)
        mel = self._mel.get(utterance)
        if mel is None:
            mel = self._mel[utterance] = MelStream(self.sample_rate, float(self.clock.fps))
            self._windows[utterance] = collections.deque()
            self._arrivals[utterance] = collections.deque()
            self._received[utterance] = 0
            if self.make_features is not None:
                self._features[utterance] = self.make_features()
        self._received[utterance] += len(samples)
        self._arrivals[utterance].append((self._received[utterance], self.clock.now_ns()))
        self._windows[utterance].extend(mel.push(samples / PCM_SCALE).windows)
        features = self._features.get(utterance)
        if features is not None:
            features.push(samples / PCM_SCALE)
        self.plan_ahead()
        return utterance

    def end_utterance(self) -> int | None:
        """Closes the open utterance: its last windows are made now (its end is known). Returns its id."""
        utterance = self.queue.end_utterance()
        if utterance is None:
            return None
        mel = self._mel.pop(utterance, None)
        frames = self.queue.frames_of(utterance)
        if frames is None:  # it held no audio: the queue dropped it
            self._forget(utterance)
            return utterance
        assert mel is not None
        self._windows[utterance].extend(mel.finish(n_frames=frames).windows)
        features = self._features.get(utterance)
        if features is not None:
            features.finish()
        self.plan_ahead()
        return utterance

    def clear(self) -> Event | None:
        """Barge-in: drops every queued utterance, its mel and the frames planned; the next frame is idle.

        Returns PLAYBACK_FINISHED(interrupted) for the utterance that was playing (or next to play),
        None when nothing was queued. The event is also sent with the next tick.
        """
        result = self.queue.clear()
        planned = list(self._planned)
        self._planned.clear()
        for frame in planned:
            if frame.face is not None:
                frame.face.cancel()
        self._plan_next = 0
        self._mel.clear()
        self._features.clear()
        if self.gate is not None:
            self.gate.reset()
        self._windows.clear()
        self._arrivals.clear()
        self._received.clear()
        if planned:  # the head utterance played up to its first frame not shown
            head = planned[0]
            played_ms = 1000.0 * frame_start_sample(head.index, self.sample_rate, self.clock.fps) / self.sample_rate
            event = Event(
                EventKind.PLAYBACK_FINISHED, head.utterance, self.clock.next_frame, played_ms, interrupted=True
            )
        elif result.utterance is None:
            return None
        else:
            event = Event(
                EventKind.PLAYBACK_FINISHED,
                result.utterance,
                self.clock.next_frame,
                result.played_ms,
                interrupted=result.interrupted,
            )
        self._pending_events.append(event)
        return event

    def plan_ahead(self) -> None:
        """With a lead: gives ready speech frames their slots and asks for their faces now.

        A frame gets the slot after the previous speech frame while that slot is still to come (an
        utterance plays on consecutive frames), else the first slot at least `lead_s` from now (an
        utterance starts, or resumes after its audio came late); only slots up to one frame past the
        lead are planned (the faces in flight stay few). When the worker stalled past the frames it
        had planned, the utterance goes on through the slots passed (their audio still goes out, the
        frames are skipped) rather than pausing: `begin_tick` does that.
        """
        if not self.lead_ns:
            return
        now = self.clock.now_ns()
        due_now = self.clock.frame_at(now)
        limit = self.clock.frame_at(now + self.lead_ns) + 1
        while self._speech_ready():
            if self._plan_next > due_now:
                frame = self._plan_next
            elif self._plan_next >= self.clock.next_frame and self.queue.peek()[1] > 0:  # type: ignore[index]
                return  # the worker stalled mid-utterance: the next tick plays on through the slots passed
            else:
                frame = max(self.clock.next_frame, self.clock.frame_at(now + self.lead_ns - 1) + 1)
            if frame > limit:
                return
            self._planned.append(self._take_speech(frame, submit=True))

    def begin_tick(self) -> FrameWork | None:
        """The slot due now and what it shows (None: none is due yet; wait `clock.seconds_until_next()`)."""
        self.plan_ahead()
        slot = self.clock.take()
        if slot is None:
            return None
        events, self._pending_events = self._pending_events, []
        audio: list[TimedAudio] = []
        while self._planned and self._planned[0].frame < slot.frame:  # planned, and their slots passed unsent
            passed = self._planned.popleft()
            if passed.face is not None:
                passed.face.cancel()
            audio.append(passed.audio)
            events += passed.events
        for frame in slot.skipped:  # speech goes on through skipped slots: audio and video stay locked
            if frame >= self._plan_next and self._speech_ready():
                passed = self._take_speech(frame, submit=False)
                audio.append(passed.audio)
                events += passed.events
        planned: _Planned | None = None
        if self._planned and self._planned[0].frame == slot.frame:
            planned = self._planned.popleft()
        elif not self.lead_ns and self._speech_ready():
            planned = self._take_speech(slot.frame, submit=True)
        elif self._speech_ready() and self._mid_utterance(slot.frame):
            # The worker stalled past the frames it had planned: the utterance goes on here (audio
            # and video stay locked), this slot without a face (skipped), the next ones planned again.
            planned = self._take_speech(slot.frame, submit=False)
        template = self.idle.template_frame(slot.frame)
        if planned is None:
            return FrameWork(slot.frame, FrameKind.IDLE, template, None, audio, events, slot.skipped, None, None)
        audio.append(planned.audio)
        events += planned.events
        work = FrameWork(
            slot.frame,
            FrameKind.SPEECH,
            template,
            None,
            audio,
            events,
            slot.skipped,
            planned.arrived_ns,
            planned.utterance,
            skip=planned.face is None,
            pending=planned.face,
            weight=planned.weight,
        )
        if planned.face is not None and (planned.face.done() or self.grace_s <= 0):
            self.settle(work)
        return work

    def settle(self, work: FrameWork) -> FrameWork:
        """Reads the face of a work whose face was `pending`: used if it is back now, else cancelled and the
        frame skipped (a late face is useless live). Call it on the session's thread before `render`."""
        ticket, work.pending = work.pending, None
        if ticket is None:
            return work
        if not ticket.done():
            ticket.cancel()
            work.skip = True
            return work
        try:
            work.face = ticket.result()
        except BaseException as exc:  # noqa: BLE001 - late, cancelled or a stage error: the frame is skipped, the session goes on
            self.face_failures += 1
            self.last_face_error = exc
            work.skip = True
        return work

    def render(self, work: FrameWork) -> Tick:
        """Composites and encodes the slot's frame (or skips it); safe off the session's thread."""
        if work.pending is not None:
            raise RuntimeError("render before settle: the frame's face is still pending")
        if work.skip:
            self.clock.dropped(face_late=True)
            return Tick(
                None, work.kind, work.audio, work.events, work.skipped, utterance=work.utterance, slot=work.frame
            )
        picture: np.ndarray | None = None  # None: composited straight into the encoder's input
        if work.face is not None and self.scale is None:
            self.compositor.frame_into(work.template, work.face, self.encoder.input_planes(), work.weight)
        else:
            picture = (
                self.idle.frame(work.frame)
                if work.face is None
                else self.compositor.frame(work.template, work.face, weight=work.weight)
            )
            if self.scale is not None:
                picture = self.scale(picture)
        if self.clock.is_late(work.frame):  # its slot ended while it was made: never send it late
            self.clock.dropped()
            return Tick(
                None, work.kind, work.audio, work.events, work.skipped, utterance=work.utterance, slot=work.frame
            )
        if picture is None:
            encoded = self.encoder.encode_input(work.frame)
        else:
            encoded = self.encoder.encode(picture, work.frame)
        self.clock.sent(work.kind)
        latency = None if work.arrived_ns is None else (self.clock.now_ns() - work.arrived_ns) / NS_PER_S
        return Tick(encoded, work.kind, work.audio, work.events, work.skipped, latency, work.utterance, work.frame)

    def tick(self) -> Tick | None:
        """The frame due now, made and encoded (None: none is due yet; wait `clock.seconds_until_next()`).
        A face still pending is not waited for (the caller that waits uses `begin_tick`, `settle`, `render`)."""
        work = self.begin_tick()
        return None if work is None else self.render(self.settle(work))

    def force_keyframe(self) -> None:
        """The next frame is a keyframe (a resumed stream starts decoding there)."""
        self.encoder.force_keyframe()

    def discard_events(self) -> None:
        """Forgets the events not yet sent (nobody is there to receive them: the stream went away)."""
        self._pending_events.clear()

    @property
    def playing(self) -> bool:
        """Speech is queued or planned (a half-closed stream ends once it has played)."""
        return bool(self._planned) or not self.queue.empty

    def close(self) -> None:
        """Cancels the faces asked for and frees the encoder."""
        for frame in self._planned:
            if frame.face is not None:
                frame.face.cancel()
        self._planned.clear()
        self.encoder.close()

    def _mid_utterance(self, frame: int) -> bool:
        """The head utterance has played up to the frame before ``frame`` (it must go on, not wait)."""
        head = self.queue.peek()
        return head is not None and head[1] > 0 and frame == self._plan_next

    def _speech_ready(self) -> bool:
        """The head utterance's next frame has its samples and its mel window (and its features)."""
        head = self.queue.peek()
        if head is None or not self._windows.get(head[0]):
            return False
        features = self._features.get(head[0])
        return features is None or features.ready(head[1])

    def _take_speech(self, frame: int, submit: bool) -> _Planned:
        """Takes the head utterance's next frame for session frame ``frame`` (and asks for its face)."""
        part = self.queue.take()
        assert part is not None
        window = self._windows[part.utterance].popleft()
        end = frame_start_sample(part.index, self.sample_rate, self.clock.fps) + len(part.samples)
        arrivals = self._arrivals[part.utterance]
        while arrivals[0][0] < end:  # chunks that ended before this frame's last sample
            arrivals.popleft()
        arrived_ns = arrivals[0][1]
        events = []
        if part.first:
            events.append(Event(EventKind.PLAYBACK_STARTED, part.utterance, frame))
        if part.last:
            events.append(
                Event(EventKind.PLAYBACK_FINISHED, part.utterance, frame + 1, 1000.0 * end / self.sample_rate)
            )
        features = self._features.get(part.utterance)
        if part.last:
            self._forget(part.utterance)
        if self.gate is not None and part.first:
            self.gate.reset()  # an utterance starts shut, whatever the one before left
        weight = 1.0 if self.gate is None else self.gate.next(window)
        face: FaceTicket | None = None
        if submit and weight == 0:  # the gate is shut: the template's mouth, no face asked for
            face = MadeFace(None)
        elif submit:
            speech = SpeechFrame(window, part.index, features)
            face = self.submit_face(frame, self.idle.template_frame(frame), speech, self.clock.due_ns(frame))
        self._plan_next = frame + 1
        audio = TimedAudio(frame, part.samples)
        return _Planned(frame, part.utterance, part.index, audio, events, arrived_ns, face, weight)

    def _forget(self, utterance: int) -> None:
        for table in (self._mel, self._windows, self._arrivals, self._received, self._features):
            table.pop(utterance, None)
