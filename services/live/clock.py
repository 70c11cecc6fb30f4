"""A live session's frame clock: frame k is due at t0 + k / fps; a frame whose time has passed is skipped.

Why integer nanoseconds: a session can run for hours, and a float t0 + k / fps loses exactness as k
grows (and 30000/1001 fps is no float at all). Here the rate is an exact fraction and every due time
is ``t0 + ceil(k * 1e9 * den / num)`` ns, so frame k's slot is the same whenever it is asked, and
`frame_at` is its exact inverse. Time comes from an injected monotonic source (``time.monotonic_ns``
in a worker, a fake in tests).

Why the session's start and not the worker's: a session resumed on another worker keeps its clock
(frame k is due k / fps after the session was created, wherever it runs), so the indices, and the
timestamps index / fps a player shows them at, follow the session's time: a gap while nobody held it
shows as a gap, never as frames played early. The wall clock is the only clock two machines share
(`started_at` turns the session's wall-clock start into this process's monotonic time).

Why skip and never delay: the output is paced to the wall clock so that the re-timed audio and the
frames stay locked. A frame that cannot be sent within its own slot (the worker was descheduled, an
encode ran long) is dropped and counted; the next frame sent is the one due now, with its own
timestamp, so a player sees a gap, never a drift.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable
from fractions import Fraction

from services.media.video_format import exact_rate  # the rule the rendered MP4s' time bases use

NS_PER_S = 1_000_000_000


class FrameKind(enum.Enum):
    """What a sent (or dropped) frame was: lip-synced speech, the idle loop, or skipped for lateness."""

    SPEECH = "speech"
    IDLE = "idle"
    SKIPPED = "skipped"


@dataclasses.dataclass
class FrameCounts:
    """Frames of a session so far, by kind (the `lipline_live_frames_total{kind}` figures)."""

    speech: int = 0
    idle: int = 0
    # skipped frames by why: the worker stalled past their slots, their face was not back in time (or
    # failed), or they were made after their slot ended
    skipped_stall: int = 0
    skipped_face: int = 0
    skipped_render: int = 0

    @property
    def skipped(self) -> int:
        return self.skipped_stall + self.skipped_face + self.skipped_render

    @property
    def total(self) -> int:
        return self.speech + self.idle + self.skipped


@dataclasses.dataclass(frozen=True)
class Slot:
    """The frame to make now, and the frames before it whose slots passed unsent (skipped)."""

    frame: int
    skipped: range


def exact_fps(fps: float | Fraction) -> Fraction:
    """25 -> 25, 29.97 -> 30000/1001 (the NTSC family snapped), others to a denominator <= 1001."""
    if isinstance(fps, Fraction):
        if fps <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        return fps
    return exact_rate(float(fps))


def started_at(
    wall_start_ns: int, monotonic_ns: Callable[[], int] = time.monotonic_ns, wall_ns: Callable[[], int] = time.time_ns
) -> int:
    """When a session that started at ``wall_start_ns`` (ns since the epoch: its row's create_time)
    started, on the ``monotonic_ns`` clock: a FrameClock's t0. A start in the future (this machine's
    wall clock is behind the one that created the session) counts as now."""
    return monotonic_ns() - max(0, wall_ns() - wall_start_ns)


class FrameClock:
    """Frame k of a session is due at ``t0 + k / fps``; says which frame is due and which are late.

    Args:
        fps: the session's frame rate (exact: see `exact_fps`).
        now: a monotonic clock in nanoseconds.
        t0: when frame 0 is due (ns on ``now``'s scale); default: now, at construction.
    """

    def __init__(
        self, fps: float | Fraction, now: Callable[[], int] = time.monotonic_ns, t0: int | None = None
    ) -> None:
        self.fps = exact_fps(fps)
        self._now = now
        self.t0 = now() if t0 is None else t0
        self._next = 0  # the first frame neither sent nor skipped
        self.counts = FrameCounts()

    @property
    def next_frame(self) -> int:
        """The first frame not yet accounted for (sent or skipped)."""
        return self._next

    def due_ns(self, frame: int) -> int:
        """When ``frame`` is due, in ns on the clock's scale (exact: ceil of the rational time)."""
        return self.t0 + -(-frame * NS_PER_S * self.fps.denominator // self.fps.numerator)

    def frame_at(self, t_ns: int) -> int:
        """The frame whose slot holds ``t_ns``: the last one due at or before it (-1 before t0)."""
        return (t_ns - self.t0) * self.fps.numerator // (NS_PER_S * self.fps.denominator)

    def now_ns(self) -> int:
        """The clock's time source, read now."""
        return self._now()

    def due_now(self) -> int:
        """The frame whose slot is now."""
        return self.frame_at(self._now())

    def is_late(self, frame: int) -> bool:
        """True once ``frame``'s slot has ended (the next frame is due): sending it now would delay the stream."""
        return self._now() >= self.due_ns(frame + 1)

    def seconds_until_next(self) -> float:
        """How long to wait before `take` has a frame to give (0 when one is due already)."""
        return max(0, self.due_ns(self._next) - self._now()) / NS_PER_S

    def take(self) -> Slot | None:
        """The frame to make now, or None when the next frame is not due yet.

        Frames before it whose slots have ended are skipped (counted): the caller makes only the frame
        of the current slot and drops the input of the skipped ones, so audio and video stay locked.
        """
        due = self.due_now()
        if due < self._next:
            return None
        skipped = range(self._next, due)
        self.counts.skipped_stall += len(skipped)
        self._next = due + 1
        return Slot(due, skipped)

    def skip_to_now(self) -> None:
        """Moves on to the frame due now without counting the frames passed as skipped: no viewer was
        there to see them (a session with no Converse stream attached makes no frames)."""
        self._next = max(self._next, self.due_now())

    def continue_from(self, frame: int) -> None:
        """The next frame made is ``frame`` at the earliest, at its own time (t0 never moves; never
        earlier than the clock already is). Why: a resumed stream goes on after the last frame its
        client received, which another worker's clock (the same session clock, on another machine's
        wall time) may have made a moment before this one's is due."""
        self._next = max(self._next, frame)

    def last_due(self, slack_s: float = 0.0) -> int:
        """The last frame due by now plus ``slack_s``: no frame after it can have been made yet (a
        resume's last_frame beyond it is impossible)."""
        return self.frame_at(self._now() + round(slack_s * NS_PER_S))

    def sent(self, kind: FrameKind) -> None:
        """Counts a frame the caller made and sent (speech or idle)."""
        if kind is FrameKind.SPEECH:
            self.counts.speech += 1
        elif kind is FrameKind.IDLE:
            self.counts.idle += 1
        else:
            raise ValueError("a sent frame is speech or idle; `dropped` counts a frame made too late")

    def dropped(self, face_late: bool = False) -> None:
        """Counts a frame that was made but not sent: finished after its slot ended (`is_late`), or, with
        ``face_late``, given up because its face was not back in time."""
        if face_late:
            self.counts.skipped_face += 1
        else:
            self.counts.skipped_render += 1

    def timestamp_ms(self, frame: int) -> float:
        """The frame's presentation time from the session's start, in ms."""
        return float(Fraction(frame * 1000) / self.fps)
