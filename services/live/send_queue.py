"""The bounded queue between a session's tick loop and its Converse stream's writer.

Why bounded and why frames are what is dropped: a client that reads slower than the frame rate must
never cost the worker memory (issue 19). Frames beyond `max_frames` waiting are dropped at once and
counted (`dropped`); the caller then forces a keyframe, so an H.264 stream decodes again from the
next frame sent (a dropped P-frame would break the references of the ones after it). Events and
stats are few (per utterance, one a second) but are bounded too (`max_control`: the oldest go).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any


class StreamClosed(Exception):
    """The queue was closed: `error` (a LiplineError or an AbortError-like status) or None for OK."""


class SendQueue:
    """Responses for one Converse stream, in order; `put_frame` refuses (False) when the frames are full."""

    def __init__(self, max_frames: int, max_control: int = 256) -> None:
        self.max_frames = max_frames
        self.max_control = max_control
        self._items: collections.deque[tuple[Any, int | None, bool]] = (
            collections.deque()
        )  # (response, arrived_ns, is_frame)
        self._frames = 0
        self._control = 0
        self._wake = asyncio.Event()
        self.dropped = 0  # frames refused because the client read too slowly
        self.dropped_control = 0
        self.closed = False
        self.error: BaseException | None = None  # why the stream ends (None: OK)

    def __len__(self) -> int:
        return len(self._items)

    def put_frame(self, response: Any, arrived_ns: int | None = None) -> bool:
        """Queues a frame; False (and counted) when `max_frames` wait already."""
        if self.closed:
            return False
        if self._frames >= self.max_frames:
            self.dropped += 1
            return False
        self._items.append((response, arrived_ns, True))
        self._frames += 1
        self._wake.set()
        return True

    def put_control(self, response: Any) -> None:
        """Queues an event or stats message (the oldest control message goes beyond `max_control`)."""
        if self.closed:
            return
        if self._control >= self.max_control:
            for i, (_, _, is_frame) in enumerate(self._items):
                if not is_frame:
                    del self._items[i]
                    self._control -= 1
                    self.dropped_control += 1
                    break
        self._items.append((response, None, False))
        self._control += 1
        self._wake.set()

    def close(self, error: BaseException | None = None) -> None:
        """No more messages; the writer sends what is queued, then ends with `error` (None: OK)."""
        if not self.closed:
            self.closed = True
            self.error = error
        self._wake.set()

    def abort(self, error: BaseException) -> None:
        """Ends the stream at once with `error`: what is queued is not sent (drain, a newer stream)."""
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
        response, arrived_ns, is_frame = self._items.popleft()
        if is_frame:
            self._frames -= 1
        else:
            self._control -= 1
        return response, arrived_ns
