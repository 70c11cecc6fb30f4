"""The bounded queue between a session's tick loop and its Converse stream's writer.

Why bounded: a client that reads slower than the frame rate must never cost the worker memory
(issue 19). Why the oldest frames go: a live viewer that fell behind wants the present, not the
past (issue 29). Frames wait here only while the writer's previous message has not been taken by
gRPC (flow control: the gateway, or the client, has not read): at most `max_frames` of them, and
none more than `max_lag_frames` behind the frame being queued. When a bound is hit the OLDEST
frames are dropped and counted (`dropped`), and with them every later frame that is not a keyframe
(an H.264 P-frame refers to the frame before it: once that is gone it cannot be decoded). When no
decodable frame is left, `need_keyframe` says the next frame must be one: the caller forces an IDR
(`FrameEncoder.force_keyframe`), and a frame that is not a keyframe is refused (counted) until one
comes. So a reader that stops for 20 s and reads again gets, after what gRPC had already taken
(docs/limits.md), frames of the last `max_lag_frames` at most, starting at a keyframe. JPEG frames
are all keyframes: exactly the oldest go.

A frame's audio goes with it (a dropped frame's audio is dropped too): each frame carries the audio
of its own slot (and of slots skipped just before it), so audio and video stay locked and a drop is
a gap in both (protos/lipline/v1/session.proto). Events and stats are few (per utterance, one a
second) and are never dropped for frames; they are bounded too (`max_control`: the oldest go).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Any


class StreamClosed(Exception):
    """The queue was closed: `error` (a LiplineError or an AbortError-like status) or None for OK."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Queued:
    response: Any
    arrived_ns: int | None
    is_frame: bool
    index: int = 0  # a frame's index on the session's clock
    keyframe: bool = True  # a decoder can start at it (an IDR, any JPEG)


class SendQueue:
    """Responses for one Converse stream, in order (see the module docstring).

    Args:
        max_frames: frames queued at most (the memory bound).
        max_lag_frames: a frame more than this many frames older than the one being queued is
            dropped (the reader fell behind: it gets the live edge); None: no such bound.
        max_control: events and stats queued at most.
    """

    def __init__(self, max_frames: int, max_lag_frames: int | None = None, max_control: int = 256) -> None:
        if max_frames < 1 or (max_lag_frames is not None and max_lag_frames < 0):
            raise ValueError(f"max_frames must be >= 1 and max_lag_frames >= 0, got {max_frames}, {max_lag_frames}")
        self.max_frames = max_frames
        self.max_lag_frames = max_lag_frames
        self.max_control = max_control
        self._items: collections.deque[_Queued] = collections.deque()
        self._frames = 0
        self._control = 0
        self._wake = asyncio.Event()
        self.dropped = 0  # frames dropped because the client read too slowly (queued ones, refused ones)
        self.dropped_control = 0
        self.need_keyframe = False  # frames were dropped and none decodable is queued: the next must be a keyframe
        self.closed = False
        self.error: BaseException | None = None  # why the stream ends (None: OK)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def frames(self) -> int:
        """Frames queued now."""
        return self._frames

    def make_room(self, index: int) -> int:
        """Drops what frame ``index``, queued next, would leave over a bound (the oldest first, and any
        frame after a dropped one that is not a keyframe); returns how many. Call it before making
        the frame: when `need_keyframe` is then set, make it a keyframe, so that no frame is lost to
        the broken reference chain but the ones already queued."""
        oldest = next((item for item in self._items if item.is_frame), None)
        too_old = self.max_lag_frames is not None and oldest is not None and oldest.index < index - self.max_lag_frames
        if self._frames < self.max_frames and not too_old:
            return 0
        lag_limit = index - self.max_lag_frames if self.max_lag_frames is not None else None
        kept: collections.deque[_Queued] = collections.deque()
        dropped, broken = 0, False
        for item in self._items:
            if not item.is_frame:
                kept.append(item)
                continue
            over = self._frames - dropped >= self.max_frames  # this one and the later ones leave no room
            stale = lag_limit is not None and item.index < lag_limit
            if over or stale or (broken and not item.keyframe):
                dropped += 1
                broken = True
                continue
            broken = False
            kept.append(item)
        self._items = kept
        self._frames -= dropped
        self.dropped += dropped
        if broken:  # the newest frame queued went: the next frame refers to it
            self.need_keyframe = True
        return dropped

    def put_frame(self, response: Any, index: int, keyframe: bool, arrived_ns: int | None = None) -> int:
        """Queues frame ``index`` after making room for it; returns the frames dropped (the oldest,
        and this one when `need_keyframe` is set and it is not a keyframe: nothing could decode it)."""
        if self.closed:
            return 0
        dropped = self.make_room(index)
        if self.need_keyframe and not keyframe:
            self.dropped += 1
            return dropped + 1
        self.need_keyframe = False
        self._items.append(_Queued(response, arrived_ns, True, index, keyframe))
        self._frames += 1
        self._wake.set()
        return dropped

    def put_control(self, response: Any) -> None:
        """Queues an event or stats message (the oldest control message goes beyond `max_control`)."""
        if self.closed:
            return
        if self._control >= self.max_control:
            for i, item in enumerate(self._items):
                if not item.is_frame:
                    del self._items[i]
                    self._control -= 1
                    self.dropped_control += 1
                    break
        self._items.append(_Queued(response, None, False))
        self._control += 1
        self._wake.set()

    def close(self, error: BaseException | None = None) -> None:
        """No more messages; the writer sends what is queued, then ends with `error` (None: OK)."""
        if not self.closed:
            self.closed = True
            self.error = error
        self._wake.set()

    def abort(self, error: BaseException | None) -> None:
        """Ends the stream at once with `error` (None: OK): what is queued is not sent (drain, a
        newer stream, the session closed)."""
        self._items.clear()
        self._frames = self._control = 0
        self.closed = True
        self.error = error
        self._wake.set()

    async def get(self) -> tuple[Any, int | None]:
        """The next (response, arrived_ns); raises StreamClosed once closed and empty."""
        while not self._items:
            if self.closed:
                raise StreamClosed()
            self._wake.clear()
            await self._wake.wait()
        item = self._items.popleft()
        if item.is_frame:
            self._frames -= 1
        else:
            self._control -= 1
        return item.response, item.arrived_ns
