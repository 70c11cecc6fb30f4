"""The frames a Converse stream has sent that its client has not acknowledged (ConverseStart.ack_window).

gRPC's flow control tells the gateway when a client's transport stops taking bytes, not when the
client stops taking frames: a client whose receive window grew by BDP probing (gRPC's default) holds
seconds of frames in its own buffers when its application stalls, and reads that past before the
live edge. A client that acknowledges the frames it takes closes that gap: the gateway sends at most
`window` frames past its last acknowledgement and then stops reading the worker's stream, where the
worker drops its oldest frames (counted) and restarts H.264 at an IDR (docs/architecture.md, "Live
sessions"). Counted in frames sent, not in indices: a dropped or skipped slot has no frame to
acknowledge.
"""

from __future__ import annotations

import asyncio
import collections

#: the largest ack_window a client may ask for (40 s at 25 fps: more buffers the past again)
MAX_ACK_WINDOW = 1000


class FrameAcks:
    """Sent-but-unacknowledged frame indices of one stream; `wait_for_room` holds the next frame back
    while `window` of them are out. A window of 0 never holds anything back (no acknowledgements)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._unacked: collections.deque[int] = collections.deque()
        self._room = asyncio.Event()
        self._room.set()

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    async def wait_for_room(self) -> None:
        await self._room.wait()

    def sent(self, index: int) -> None:
        if not self.window:
            return
        self._unacked.append(index)
        if len(self._unacked) >= self.window:
            self._room.clear()

    def acked(self, index: int) -> None:
        """The client took every frame up to `index` (an ack of a frame not sent yet acknowledges what was)."""
        while self._unacked and self._unacked[0] <= index:
            self._unacked.popleft()
        if len(self._unacked) < self.window:
            self._room.set()

    def stop(self) -> None:
        """No more acknowledgements can come (the client ended its side): hold nothing back from now on."""
        self.window = 0
        self._unacked.clear()
        self._room.set()
