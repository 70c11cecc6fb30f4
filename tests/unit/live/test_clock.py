"""FrameClock on a fake monotonic clock: due frames, late frames skipped (never delayed), counts."""

from __future__ import annotations

from fractions import Fraction

import pytest

from services.live.clock import NS_PER_S, FrameClock, FrameKind, Slot, started_at


class FakeClock:
    """A monotonic clock in ns that moves only when told."""

    def __init__(self, start: int = 5 * NS_PER_S) -> None:
        self.t = start

    def __call__(self) -> int:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += round(seconds * NS_PER_S)


def test_frame_k_is_due_at_t0_plus_k_over_fps() -> None:
    fake = FakeClock()
    clock = FrameClock(25, fake)
    assert clock.t0 == fake.t and clock.due_ns(0) == fake.t
    assert clock.due_ns(1) - clock.t0 == 40_000_000 and clock.due_ns(25) - clock.t0 == NS_PER_S
    assert clock.due_now() == 0
    fake.advance(0.039999999)
    assert clock.due_now() == 0
    fake.advance(0.000000001)
    assert clock.due_now() == 1
    assert clock.frame_at(clock.t0 - 1) == -1
    assert clock.timestamp_ms(3) == 120.0


def test_ntsc_rate_has_no_drift_over_an_hour() -> None:
    """30000/1001 fps: frame 107,892 (one hour) is due at exactly 3,599.9964 s; frame_at inverts due_ns everywhere."""
    clock = FrameClock(29.97, FakeClock(0), t0=0)
    assert clock.fps == Fraction(30000, 1001)
    hour = 107_892
    assert clock.due_ns(hour) == 3_599_996_400_000  # 107892 * 1001 / 30000 s, exactly
    for k in (0, 1, 2, 999, hour, hour + 1, 10 * hour + 7):
        assert clock.frame_at(clock.due_ns(k)) == k
        assert clock.frame_at(clock.due_ns(k) - 1) == k - 1
    assert clock.timestamp_ms(hour) == pytest.approx(3_599_996.4)


def test_take_gives_each_frame_once_at_its_time() -> None:
    fake = FakeClock()
    clock = FrameClock(25, fake)
    assert clock.take() == Slot(0, range(0, 0))
    assert clock.take() is None  # frame 1 is not due yet
    assert clock.seconds_until_next() == pytest.approx(0.04)
    fake.advance(0.01)
    assert clock.seconds_until_next() == pytest.approx(0.03)
    fake.advance(0.03)
    assert clock.seconds_until_next() == 0
    assert clock.take() == Slot(1, range(1, 1))
    assert clock.next_frame == 2


def test_frames_whose_slots_passed_are_skipped_not_delayed() -> None:
    """The worker stalls 130 ms after frame 0: frames 1 and 2 are skipped, frame 3 (due now) is made."""
    fake = FakeClock()
    clock = FrameClock(25, fake)
    clock.take()
    clock.sent(FrameKind.SPEECH)
    fake.advance(0.130)
    slot = clock.take()
    assert slot == Slot(3, range(1, 3))
    assert clock.counts.skipped == 2
    clock.sent(FrameKind.IDLE)
    assert (clock.counts.speech, clock.counts.idle, clock.counts.skipped, clock.counts.total) == (1, 1, 2, 4)
    assert clock.next_frame == 4  # the stream goes on from now: no frame waits for the skipped ones


def test_a_frame_made_past_its_slot_is_late_and_dropped() -> None:
    fake = FakeClock()
    clock = FrameClock(25, fake)
    slot = clock.take()
    assert slot is not None
    fake.advance(0.0399)  # the encode took almost the whole slot: still on time
    assert not clock.is_late(slot.frame)
    fake.advance(0.0001)  # the next frame is due: this one would delay the stream
    assert clock.is_late(slot.frame)
    clock.dropped()
    assert clock.counts.skipped == 1 and clock.counts.total == 1
    with pytest.raises(ValueError):
        clock.sent(FrameKind.SKIPPED)


def test_a_given_t0_and_a_bad_rate() -> None:
    fake = FakeClock(0)
    clock = FrameClock(25, fake, t0=NS_PER_S)
    assert clock.take() is None and clock.seconds_until_next() == 1.0
    with pytest.raises(ValueError):
        FrameClock(0, fake)
    with pytest.raises(ValueError):
        FrameClock(Fraction(-1), fake)


def test_a_resumed_stream_goes_on_after_the_last_frame_on_the_sessions_clock() -> None:
    """The numbering is the session's: t0 never moves. A client that got frame 13 from another worker
    (its clock a little ahead) gets frame 14 next, when it is due; a last frame in the past changes nothing."""
    fake = FakeClock()
    clock = FrameClock(25, fake)
    t0 = clock.t0
    fake.advance(0.48)  # frame 12 is due
    clock.skip_to_now()
    clock.continue_from(14)
    assert clock.take() is None and clock.seconds_until_next() == pytest.approx(0.08)
    fake.advance(0.08)
    assert clock.take() == Slot(14, range(14, 14)) and clock.t0 == t0
    assert clock.counts.skipped == 0
    clock.continue_from(10)  # never back: the encoder's pts only grow
    fake.advance(0.04)
    assert clock.take().frame == 15
    assert clock.last_due() == 15 and clock.last_due(1.0) == 40


def test_a_session_started_elsewhere_keeps_its_start() -> None:
    """started_at: the session's wall-clock start on this process's monotonic clock, so a worker that
    takes the session over numbers its frames from the session's start, not its own."""
    mono, wall = FakeClock(100 * NS_PER_S), FakeClock(1_700_000_000 * NS_PER_S)
    t0 = started_at(wall.t - 10 * NS_PER_S, mono, wall)  # created 10 s ago on another machine
    assert t0 == mono.t - 10 * NS_PER_S
    clock = FrameClock(25, mono, t0=t0)
    assert clock.take() == Slot(250, range(0, 250))  # frame 250 is due: 10 s at 25 fps
    assert started_at(wall.t + NS_PER_S, mono, wall) == mono.t  # a start "in the future": now
