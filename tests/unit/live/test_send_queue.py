"""SendQueue: a slow reader loses frames (counted), never the worker's memory; events keep their order."""

from __future__ import annotations

import asyncio

import pytest

from services.live.send_queue import SendQueue, StreamClosed


def test_frames_beyond_the_bound_are_dropped_and_counted() -> None:
    async def main() -> None:
        q = SendQueue(max_frames=3)
        assert [q.put_frame(f"frame {i}", i) for i in range(5)] == [True, True, True, False, False]
        q.put_control("event")  # events are not frames: they still go in
        assert q.dropped == 2 and len(q) == 4
        assert await q.get() == ("frame 0", 0)
        assert q.put_frame("frame 5")  # room again
        got = [(await q.get())[0] for _ in range(4)]
        assert got == ["frame 1", "frame 2", "event", "frame 5"]

    asyncio.run(main())


def test_control_messages_are_bounded_too_the_oldest_go() -> None:
    async def main() -> None:
        q = SendQueue(max_frames=2, max_control=2)
        q.put_frame("frame")
        for i in range(4):
            q.put_control(f"stats {i}")
        assert q.dropped_control == 2
        assert [(await q.get())[0] for _ in range(3)] == ["frame", "stats 2", "stats 3"]

    asyncio.run(main())


def test_close_sends_what_is_queued_abort_drops_it() -> None:
    async def main() -> None:
        q = SendQueue(max_frames=4)
        q.put_frame("a")
        q.close()
        assert not q.put_frame("b")
        assert (await q.get())[0] == "a"
        with pytest.raises(StreamClosed):
            await q.get()
        assert q.error is None
        aborted = SendQueue(max_frames=4)
        aborted.put_frame("stale")
        reason = RuntimeError("draining")
        aborted.abort(reason)
        with pytest.raises(StreamClosed):
            await aborted.get()
        assert aborted.error is reason

    asyncio.run(main())


def test_a_waiting_reader_wakes_on_put_and_on_close() -> None:
    async def main() -> None:
        q = SendQueue(max_frames=1)
        reader = asyncio.create_task(q.get())
        await asyncio.sleep(0.01)
        assert not reader.done()
        q.put_frame("x", 7)
        assert await asyncio.wait_for(reader, 10) == ("x", 7)
        reader = asyncio.create_task(q.get())
        await asyncio.sleep(0.01)
        q.close()
        with pytest.raises(StreamClosed):
            await asyncio.wait_for(reader, 10)

    asyncio.run(main())
