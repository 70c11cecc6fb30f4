"""The input speech re-timed to the frames, and the queue of utterances a session plays from.

Re-timing: frame j of an utterance carries the utterance's samples with time in [j / fps, (j + 1) / fps),
that is samples [ceil(j * rate / fps), ceil((j + 1) * rate / fps)). Integer arithmetic on the exact
rate (30000/1001 is no float): the slices tile the input exactly, so concatenated they are the input
bit for bit, and frame j's first sample is the same number after an hour as it would be after a
second (at 48 kHz and 29.97 fps the slices are 1,601 or 1,602 samples, never drifting). An
utterance starts playing on a frame boundary of the session, so its audio and its frames stay
locked for as long as it plays.

The queue (`SpeechQueue`): utterances in arrival order; the head one plays frame by frame (`take`);
`clear` (barge-in) drops everything queued and says how far the head one had played. The queued,
unplayed audio is bounded (`max_samples`): a client that sends faster than real time is refused
(`NoCapacity`, RESOURCE_EXHAUSTED with `retry-after-ms`: when the queue will have played enough to
take the chunk) once the bound is reached, and never costs the worker more memory.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from fractions import Fraction

import numpy as np

from services.serving.errors import NoCapacity


def frame_start_sample(frame: int, rate: int, fps: Fraction) -> int:
    """The first sample of frame ``frame``: ceil(frame * rate / fps), exactly."""
    return -(-frame * rate * fps.denominator // fps.numerator)


def frame_sample_range(frame: int, rate: int, fps: Fraction) -> tuple[int, int]:
    """Samples [start, stop) that frame ``frame`` carries."""
    return frame_start_sample(frame, rate, fps), frame_start_sample(frame + 1, rate, fps)


def frames_for_samples(samples: int, rate: int, fps: Fraction) -> int:
    """Frames needed to carry ``samples`` samples: the frames whose first sample is before the end.

    frame_start_sample(k) < n  <=>  k * rate / fps <= n - 1  <=>  k <= (n - 1) * fps / rate.
    """
    if samples <= 0:
        return 0
    return (samples - 1) * fps.numerator // (rate * fps.denominator) + 1


@dataclasses.dataclass(frozen=True)
class FrameAudio:
    """Frame ``index`` of utterance ``utterance``: its samples (int16 at the session's rate)."""

    utterance: int
    index: int
    samples: np.ndarray
    first: bool  # the utterance's playback starts with this frame
    last: bool  # and finishes with it (the utterance had ended and this is its last frame)


@dataclasses.dataclass(frozen=True)
class ClearResult:
    """What `SpeechQueue.clear` dropped, for the PLAYBACK_FINISHED(interrupted) event."""

    utterance: int | None  # the head utterance (playing, or next to play); None: the queue was empty
    started: bool  # the head utterance had played at least one frame (so its playback was reported started)
    played_samples: int  # of the head utterance, at the session's rate
    played_ms: float
    interrupted: bool  # audio that would have played was dropped
    dropped_samples: int  # unplayed samples thrown away, every utterance together


@dataclasses.dataclass
class _Utterance:
    id: int
    pending: list[np.ndarray]  # received chunks not yet handed out, in order
    pending_offset: int  # samples of pending[0] already handed out
    received: int = 0
    frames_taken: int = 0
    ended: bool = False


class SpeechQueue:
    """Utterances in, one frame's audio at a time out; `clear` empties it.

    Args:
        rate: the session's input rate (16000, 24000 or 48000).
        fps: the session's exact frame rate.
        max_samples: the bound on queued, unplayed samples (every utterance together).
    """

    def __init__(self, rate: int, fps: Fraction, max_samples: int) -> None:
        if rate <= 0 or max_samples <= 0:
            raise ValueError(f"rate and max_samples must be positive, got {rate}, {max_samples}")
        self.rate = rate
        self.fps = fps
        self.max_samples = max_samples
        self._utterances: collections.deque[_Utterance] = collections.deque()
        self._next_id = 0
        self._queued = 0  # received and not yet handed out

    @property
    def queued_samples(self) -> int:
        """Received samples not yet handed out, every utterance together (the backpressure figure)."""
        return self._queued

    @property
    def empty(self) -> bool:
        return not self._utterances

    def push(self, samples: np.ndarray) -> int:
        """Appends samples to the open utterance (opening one after an `end_utterance`); returns its id.

        Raises:
            NoCapacity: the queue would hold more than ``max_samples`` unplayed samples; its
                `retry_after_ms` is how long the queue takes to play enough to take the chunk.
        """
        samples = np.asarray(samples, dtype=np.int16)
        excess = self._queued + len(samples) - self.max_samples
        if excess > 0:
            raise NoCapacity(
                f"speech queue full: {self._queued / self.rate:.2f} s of audio wait to be played, the limit is "
                f"{self.max_samples / self.rate:.2f} s; send audio in real time (chunks of 10-100 ms as it plays)",
                max(1, math.ceil(1000 * excess / self.rate)),
            )
        if not self._utterances or self._utterances[-1].ended:
            self._utterances.append(_Utterance(self._next_id, [], 0))
            self._next_id += 1
        utterance = self._utterances[-1]
        if len(samples):
            utterance.pending.append(samples.copy())
            utterance.received += len(samples)
            self._queued += len(samples)
        return utterance.id

    def end_utterance(self) -> int | None:
        """Closes the open utterance (its last frame may be short); returns its id, None when none was open."""
        if not self._utterances or self._utterances[-1].ended:
            return None
        utterance = self._utterances[-1]
        utterance.ended = True
        if utterance.received == 0:  # an empty utterance plays nothing
            self._utterances.pop()
        return utterance.id

    def frames_of(self, utterance_id: int) -> int | None:
        """An ended utterance's frame count (None while it is open or unknown)."""
        for utterance in self._utterances:
            if utterance.id == utterance_id:
                return frames_for_samples(utterance.received, self.rate, self.fps) if utterance.ended else None
        return None

    def peek(self) -> tuple[int, int] | None:
        """(utterance id, frame index) that `take` would give next, when its samples have all arrived."""
        if not self._utterances:
            return None
        head = self._utterances[0]
        stop = frame_start_sample(head.frames_taken + 1, self.rate, self.fps)
        if head.received >= stop or head.ended:
            return head.id, head.frames_taken
        return None

    def take(self) -> FrameAudio | None:
        """The next frame's audio of the head utterance, or None when its samples have not all arrived."""
        if self.peek() is None:
            return None
        head = self._utterances[0]
        start, stop = frame_sample_range(head.frames_taken, self.rate, self.fps)
        stop = min(stop, head.received)
        samples = self._pop_samples(head, stop - start)
        index = head.frames_taken
        head.frames_taken += 1
        last = head.ended and frame_start_sample(head.frames_taken, self.rate, self.fps) >= head.received
        if last:
            self._utterances.popleft()
        return FrameAudio(head.id, index, samples, first=index == 0, last=last)

    def clear(self) -> ClearResult:
        """Drops every queued utterance; says how far the head one had played and what was lost."""
        if not self._utterances:
            return ClearResult(None, False, 0, 0.0, False, 0)
        head = self._utterances[0]
        played = min(frame_start_sample(head.frames_taken, self.rate, self.fps), head.received)
        dropped = self._queued
        interrupted = dropped > 0 or not head.ended  # an open utterance would have gone on
        self._utterances.clear()
        self._queued = 0
        return ClearResult(head.id, head.frames_taken > 0, played, 1000.0 * played / self.rate, interrupted, dropped)

    def _pop_samples(self, utterance: _Utterance, count: int) -> np.ndarray:
        out = np.empty(count, dtype=np.int16)
        filled = 0
        while filled < count:
            chunk = utterance.pending[0]
            n = min(count - filled, len(chunk) - utterance.pending_offset)
            out[filled : filled + n] = chunk[utterance.pending_offset : utterance.pending_offset + n]
            filled += n
            utterance.pending_offset += n
            if utterance.pending_offset == len(chunk):
                utterance.pending.pop(0)
                utterance.pending_offset = 0
        self._queued -= count
        return out
