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
* Late frames are skipped, never delayed: slots that passed unsent are skipped by the clock, and
  while speech plays, the utterance advances through them too (their audio is still returned, with
  their timestamps, so the audio track has no hole and stays locked to the frames); a frame whose slot
  ends before it is encoded is dropped before the encoder sees it (an H.264 frame encoded and not
  sent would break the reference chain of the frames after it).
* An utterance whose next window is not there yet (the client sends slower than real time) waits:
  idle frames play meanwhile and the utterance resumes where it was.
* `clear` (barge-in) empties the queue and the mel; the next tick is idle; the event
  PLAYBACK_FINISHED(interrupted) says how far the utterance had played.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Callable

import numpy as np

from services.live.audio_retime import SpeechQueue, frame_start_sample
from services.live.clock import NS_PER_S, FrameClock, FrameCounts, FrameKind
from services.live.encoders import EncodedFrame, FrameEncoder
from services.live.idle import IdleLoop
from services.live.mel_stream import PCM_SCALE, MelStream, check_sample_rate, pcm_int16
from services.media.composite import Compositor
from services.serving.errors import InvalidRequest

#: (template frame, mel window (80, 16) float32) -> the generated face, BGR at the frame's box size, or
#: None when that template frame has no face (it passes through).
FaceGenerator = Callable[[int, np.ndarray], np.ndarray | None]

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


class LiveSession:
    """A session's state and rules; every call is made from one thread (the worker's tick loop).

    Args:
        idle: the avatar's idle loop (its I420 frames and loop mode).
        compositor: pastes a generated face into a template frame (the avatar's boxes).
        encoder: the session's per-frame encoder.
        clock: the session's frame clock (its fps is the session's).
        generate_face: the face generator (see `FaceGenerator`).
        sample_rate: the input PCM's rate (16000, 24000 or 48000).
        max_queued_seconds: the bound on queued, unplayed speech (backpressure).
    """

    def __init__(
        self,
        idle: IdleLoop,
        compositor: Compositor,
        encoder: FrameEncoder,
        clock: FrameClock,
        generate_face: FaceGenerator,
        sample_rate: int,
        max_queued_seconds: float = 10.0,
    ) -> None:
        self.idle = idle
        self.compositor = compositor
        self.encoder = encoder
        self.clock = clock
        self.generate_face = generate_face
        self.sample_rate = sample_rate
        check_sample_rate(sample_rate)  # before any audio, not at the first chunk
        self.queue = SpeechQueue(sample_rate, clock.fps, max_samples=round(max_queued_seconds * sample_rate))
        self._mel: dict[int, MelStream] = {}  # open utterances' mel streams
        self._windows: dict[int, collections.deque[np.ndarray]] = {}  # ready windows of queued utterances
        # per queued utterance, (samples received after a chunk, when it arrived in ns): the latency's start
        self._arrivals: dict[int, collections.deque[tuple[int, int]]] = {}
        self._received: dict[int, int] = {}
        self._pending_events: list[Event] = []

    @property
    def counts(self) -> FrameCounts:
        """Frames so far by kind: speech, idle, skipped."""
        return self.clock.counts

    def push_audio(self, pcm: bytes) -> int:
        """Appends an s16le chunk to the open utterance; returns its id.

        Raises:
            InvalidMedia: an odd byte count. InvalidRequest: a chunk over `MAX_CHUNK_MS`.
            TooLarge: the speech queue's bound (the chunk is dropped whole, nothing else changes).
        """
        samples = pcm_int16(pcm)
        if len(samples) * 1000 > MAX_CHUNK_MS * self.sample_rate:
            ms = 1000 * len(samples) / self.sample_rate
            raise InvalidRequest(
                f"audio chunk of {ms:.0f} ms ({len(pcm)} bytes at {self.sample_rate} Hz): send chunks of 10-{MAX_CHUNK_MS} ms"
            )
        utterance = self.queue.push(samples)
        mel = self._mel.get(utterance)
        if mel is None:
            mel = self._mel[utterance] = MelStream(self.sample_rate, float(self.clock.fps))
            self._windows[utterance] = collections.deque()
            self._arrivals[utterance] = collections.deque()
            self._received[utterance] = 0
        self._received[utterance] += len(samples)
        self._arrivals[utterance].append((self._received[utterance], self.clock.now_ns()))
        self._windows[utterance].extend(mel.push(samples / PCM_SCALE).windows)
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
        return utterance

    def clear(self) -> Event | None:
        """Barge-in: drops every queued utterance and its mel; the next frame is idle.

        Returns PLAYBACK_FINISHED(interrupted) for the utterance that was playing (or next to play),
        None when nothing was queued. The event is also sent with the next tick.
        """
        result = self.queue.clear()
        self._mel.clear()
        self._windows.clear()
        self._arrivals.clear()
        self._received.clear()
        if result.utterance is None:
            return None
        event = Event(
            EventKind.PLAYBACK_FINISHED,
            result.utterance,
            self.clock.next_frame,
            result.played_ms,
            interrupted=result.interrupted,
        )
        self._pending_events.append(event)
        return event

    def tick(self) -> Tick | None:
        """The frame due now (None: none is due yet; wait `clock.seconds_until_next()`)."""
        slot = self.clock.take()
        if slot is None:
            return None
        events, self._pending_events = self._pending_events, []
        audio: list[TimedAudio] = []
        for frame in slot.skipped:  # speech goes on through skipped slots: audio and video stay locked
            if self._speech_ready():
                self._take_speech(frame, audio, events)
        face_window, arrived_ns = self._take_speech(slot.frame, audio, events) if self._speech_ready() else (None, None)
        kind = FrameKind.IDLE if face_window is None else FrameKind.SPEECH
        template = self.idle.template_frame(slot.frame)
        if face_window is None:
            picture = self.idle.frame(slot.frame)
        else:
            face = self.generate_face(template, face_window)
            picture = self.compositor.frame(template, face) if face is not None else self.idle.frame(slot.frame)
        if self.clock.is_late(slot.frame):  # its slot ended while it was made: never send it late
            self.clock.dropped()
            return Tick(None, kind, audio, events, slot.skipped)
        encoded = self.encoder.encode(picture, slot.frame)
        self.clock.sent(kind)
        latency = None if arrived_ns is None else (self.clock.now_ns() - arrived_ns) / NS_PER_S
        return Tick(encoded, kind, audio, events, slot.skipped, latency)

    def force_keyframe(self) -> None:
        """The next frame is a keyframe (a resumed stream starts decoding there)."""
        self.encoder.force_keyframe()

    def _speech_ready(self) -> bool:
        """The head utterance's next frame has its samples and its mel window."""
        head = self.queue.peek()
        return head is not None and bool(self._windows.get(head[0]))

    def _take_speech(self, frame: int, audio: list[TimedAudio], events: list[Event]) -> tuple[np.ndarray, int]:
        """Takes the head utterance's next frame for session frame ``frame``: (its window, when its audio arrived)."""
        part = self.queue.take()
        assert part is not None
        window = self._windows[part.utterance].popleft()
        audio.append(TimedAudio(frame, part.samples))
        end = frame_start_sample(part.index, self.sample_rate, self.clock.fps) + len(part.samples)
        arrivals = self._arrivals[part.utterance]
        while arrivals[0][0] < end:  # chunks that ended before this frame's last sample
            arrivals.popleft()
        arrived_ns = arrivals[0][1]
        if part.first:
            events.append(Event(EventKind.PLAYBACK_STARTED, part.utterance, frame))
        if part.last:
            self._forget(part.utterance)
            events.append(
                Event(EventKind.PLAYBACK_FINISHED, part.utterance, frame + 1, 1000.0 * end / self.sample_rate)
            )
        return window, arrived_ns

    def _forget(self, utterance: int) -> None:
        for table in (self._mel, self._windows, self._arrivals, self._received):
            table.pop(utterance, None)
