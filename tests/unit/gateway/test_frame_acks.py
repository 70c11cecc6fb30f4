"""FrameAcks: the frames a stream may send past the client's last acknowledgement."""

from __future__ import annotations

import asyncio

import pytest

from lipline.v1 import session_pb2
from services.gateway.converse import check_ack_window
from services.gateway.frame_acks import MAX_ACK_WINDOW, FrameAcks
from services.serving.errors import InvalidRequest


def has_room(acks: FrameAcks) -> bool:
    """Whether the next frame may go now (the event set: no waiting involved)."""
    return acks._room.is_set()


def test_the_window_counts_frames_sent_not_indices() -> None:
    acks = FrameAcks(3)
    for index in (10, 11, 40):  # 12-39 were dropped or skipped: nothing to acknowledge
        assert has_room(acks)
        acks.sent(index)
    assert not has_room(acks) and acks.unacked == 3
    acks.acked(11)
    assert has_room(acks) and acks.unacked == 1
    acks.sent(41)
    acks.sent(42)
    assert not has_room(acks)
    acks.acked(1000)  # past what was sent: everything sent is acknowledged
    assert has_room(acks) and acks.unacked == 0


def test_a_window_of_zero_holds_nothing_back_and_stop_frees_the_stream() -> None:
    off = FrameAcks(0)
    for index in range(100):
        off.sent(index)
    assert has_room(off) and off.unacked == 0
    on = FrameAcks(1)
    on.sent(0)
    assert not has_room(on)
    on.stop()  # the client ended its side: no ack can come
    on.sent(1)
    assert has_room(on)


def test_a_held_frame_goes_when_its_ack_comes() -> None:
    async def scenario() -> list[str]:
        acks, said = FrameAcks(1), []
        acks.sent(0)

        async def relay() -> None:
            await acks.wait_for_room()
            said.append("frame 1 sent")

        task = asyncio.create_task(relay())
        await asyncio.sleep(0)
        said.append("ack 0")
        acks.acked(0)
        await task
        return said

    assert asyncio.run(scenario()) == ["ack 0", "frame 1 sent"]


def test_an_ack_window_past_the_bound_is_refused_with_the_bound() -> None:
    check_ack_window(session_pb2.ConverseStart(ack_window=MAX_ACK_WINDOW))
    with pytest.raises(InvalidRequest, match=f"over {MAX_ACK_WINDOW} frames"):
        check_ack_window(session_pb2.ConverseStart(ack_window=MAX_ACK_WINDOW + 1))
