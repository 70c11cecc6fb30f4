"""SendQueue: a slow reader loses the oldest frames (counted) and gets the live edge, never the worker's
memory; an H.264 stream restarts at a keyframe; events keep their order."""

from __future__ import annotations

import asyncio

import pytest

from services.live.send_queue import SendQueue, StreamClosed


async def taken(q: SendQueue) -> list:
    return [(await q.get())[0] for _ in range(len(q))]


def test_beyond_the_bound_the_oldest_frames_go() -> None:
    """JPEG: every frame is a keyframe, so exactly the oldest go and the newest are kept."""

    async def main() -> None:
        q = SendQueue(max_frames=3)
        assert [q.put_frame(f"frame {i}", i, keyframe=True, arrived_ns=i) for i in range(5)] == [0, 0, 0, 1, 1]
        q.put_control("event")  # events are not frames: they still go in
        assert q.dropped == 2 and len(q) == 4 and not q.need_keyframe
        assert await q.get() == ("frame 2", 2)
        assert q.put_frame("frame 5", 5, keyframe=True) == 0  # room again
        assert await taken(q) == ["frame 3", "frame 4", "event", "frame 5"]

    asyncio.run(main())


def test_a_broken_reference_chain_is_dropped_whole_and_the_next_frame_must_be_a_keyframe() -> None:
    """H.264: a P-frame after a dropped frame cannot be decoded, so it goes too; with nothing decodable
    left the queue wants a keyframe and refuses P-frames (counted) until one comes."""

    async def main() -> None:
        q = SendQueue(max_frames=3)
        for i in range(3):
            assert q.put_frame(f"frame {i}", i, keyframe=i == 0) == 0
        assert q.put_frame("frame 3", 3, keyframe=False) == 4  # 0 (the oldest), 1 and 2 (its chain), 3 itself
        assert q.need_keyframe and q.frames == 0
        assert q.put_frame("frame 4", 4, keyframe=False) == 1  # still no keyframe: refused
        assert q.put_frame("frame 5", 5, keyframe=True) == 0 and not q.need_keyframe
        assert q.put_frame("frame 6", 6, keyframe=False) == 0  # it refers to frame 5: kept
        assert q.dropped == 5
        assert await taken(q) == ["frame 5", "frame 6"]

        # A keyframe still queued after the dropped ones: the chain goes on from it.
        q = SendQueue(max_frames=3)
        for i, key in enumerate((True, False, True)):
            q.put_frame(f"frame {i}", i, keyframe=key)
        assert q.put_frame("frame 3", 3, keyframe=False) == 2 and not q.need_keyframe
        assert await taken(q) == ["frame 2", "frame 3"]

    asyncio.run(main())


def test_a_reader_that_fell_behind_gets_the_live_edge() -> None:
    """Frames more than `max_lag_frames` behind the one being queued go, however few are queued;
    `make_room` before a frame is made says whether it must be a keyframe (so it is not lost too)."""

    async def main() -> None:
        q = SendQueue(max_frames=100, max_lag_frames=5)
        for i in range(6):
            q.put_frame(f"frame {i}", i, keyframe=i == 0)
        # Frame 0 is 6 behind frame 6: it goes, and with it 1-5 (they refer to it) and 6 itself.
        assert q.put_frame("frame 6", 6, keyframe=False) == 7
        assert q.frames == 0 and q.need_keyframe and q.dropped == 7
        q = SendQueue(max_frames=100, max_lag_frames=5)
        for i in range(3):
            q.put_frame(f"frame {i}", i, keyframe=i == 0)
        q.put_control("stats")
        assert q.make_room(3) == 0  # within the lag
        assert q.make_room(9) == 3 and q.need_keyframe  # every queued frame is more than 5 behind frame 9
        assert q.put_frame("frame 9", 9, keyframe=True) == 0  # made a keyframe: nothing more lost
        assert await taken(q) == ["stats", "frame 9"]  # events are never dropped for frames

    asyncio.run(main())


def test_control_messages_are_bounded_too_the_oldest_go() -> None:
    async def main() -> None:
        q = SendQueue(max_frames=2, max_control=2)
        q.put_frame("frame", 0, keyframe=True)
        for i in range(4):
            q.put_control(f"stats {i}")
        assert q.dropped_control == 2
        assert await taken(q) == ["frame", "stats 2", "stats 3"]

    asyncio.run(main())


def test_close_sends_what_is_queued_abort_drops_it() -> None:
    async def main() -> None:
        q = SendQueue(max_frames=4)
        q.put_frame("a", 0, keyframe=True)
        q.close()
        assert q.put_frame("b", 1, keyframe=True) == 0 and q.frames == 1  # closed: nothing more goes in
        assert (await q.get())[0] == "a"
        with pytest.raises(StreamClosed):
            await q.get()
        assert q.error is None
        aborted = SendQueue(max_frames=4)
        aborted.put_frame("stale", 0, keyframe=True)
        reason = RuntimeError("draining")
        aborted.abort(reason)
        with pytest.raises(StreamClosed):
            await aborted.get()
        assert aborted.error is reason and aborted.frames == 0

    asyncio.run(main())


def test_a_waiting_reader_wakes_on_put_and_on_close() -> None:
    async def main() -> None:
        q = SendQueue(max_frames=1)
        reader = asyncio.create_task(q.get())
        await asyncio.sleep(0.01)
        assert not reader.done()
        q.put_frame("x", 0, keyframe=True, arrived_ns=7)
        assert await asyncio.wait_for(reader, 10) == ("x", 7)
        reader = asyncio.create_task(q.get())
        await asyncio.sleep(0.01)
        q.close()
        with pytest.raises(StreamClosed):
            await asyncio.wait_for(reader, 10)

    asyncio.run(main())


def test_bounds_must_make_sense() -> None:
    for frames, lag in ((0, None), (3, -1)):
        with pytest.raises(ValueError):
            SendQueue(frames, lag)
