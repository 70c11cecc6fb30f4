"""A segment's stage streams (services.render.segment.SegmentRenderer) when their requests fail: the
failure reaches `render` as itself, never as a bare cancel (issue 29). Stand-in lipsync and superres
stages run on 127.0.0.1 in this event loop; the avatar is a small one built here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from lipline.v1 import lipsync_pb2_grpc, superres_pb2_grpc
from services.jobs.avatar_cache import LocalAvatar
from services.jobs.avatars import AvatarMeta
from services.jobs.segment_audio import SegmentAudio
from services.media.composite import Compositor, I420Frames
from services.render.segment import SegmentRenderer
from services.serving.channels import StageFailed
from services.serving.metrics import Metrics

FRAMES, SIDE = 4, 64
BOX = (8, 8, 56, 56)


def small_avatar() -> LocalAvatar:
    boxes: list = [BOX] * FRAMES
    meta = AvatarMeta("a1", "ann", 25.0, 0.0, FRAMES, SIDE, SIDE, boxes, 0.0)
    crops = np.zeros((FRAMES, 96, 96, 3), np.uint8)
    frames = I420Frames(np.zeros((FRAMES, SIDE * 3 // 2, SIDE), np.uint8))
    return LocalAvatar(meta, crops, {i: i for i in range(FRAMES)}, Compositor(frames, boxes))


class Lipsync(lipsync_pb2_grpc.LipSyncServiceServicer):
    """Reads Generate's requests; after the first, ends the call with `abort` (or keeps reading)."""

    def __init__(self, abort: grpc.StatusCode | None = None) -> None:
        self.abort = abort

    async def Generate(self, request_iterator, context):
        async for _ in request_iterator:
            if self.abort is not None:
                await context.abort(self.abort, "the stand-in lipsync stage is out of room")
        return
        yield  # an async generator: a stream of no responses


class Superres(superres_pb2_grpc.SuperResServiceServicer):
    """Reads Upscale's requests and answers none."""

    async def Upscale(self, request_iterator, context):
        async for _ in request_iterator:
            pass
        return
        yield


@contextlib.asynccontextmanager
async def renderer(lipsync: Lipsync) -> AsyncIterator[SegmentRenderer]:
    server = grpc.aio.server()
    lipsync_pb2_grpc.add_LipSyncServiceServicer_to_server(lipsync, server)
    superres_pb2_grpc.add_SuperResServiceServicer_to_server(Superres(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    segments = None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            segments = SegmentRenderer(
                lipsync_pb2_grpc.LipSyncServiceStub(channel),
                superres_pb2_grpc.SuperResServiceStub(channel),
                Metrics("render"),
                preset="ultrafast",
                threads=1,
            )
            yield segments
    finally:
        if segments is not None:
            segments.close()
        await server.stop(0)


def render(tmp_path: Path, lipsync: Lipsync, mels: int, super_resolution: bool) -> None:
    audio = SegmentAudio(np.zeros((mels, 80, 16), np.float16), None)

    async def run() -> None:
        async with renderer(lipsync) as segments:
            await asyncio.wait_for(
                segments.render(small_avatar(), 0, FRAMES, audio, super_resolution, 23, tmp_path / "segment.mp4"),
                60,
            )

    asyncio.run(run())


def test_a_lipsync_failure_read_by_the_upscale_requests_is_the_lipsync_stages(tmp_path: Path) -> None:
    """With super-resolution, Upscale's requests are lipsync's answers: lipsync's status must come out
    as lipsync's (on main it came out as a bare CancelledError)."""
    with pytest.raises(StageFailed, match="lipsync stage failed") as failed:
        render(tmp_path, Lipsync(abort=grpc.StatusCode.RESOURCE_EXHAUSTED), FRAMES, super_resolution=True)
    assert failed.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not (tmp_path / "segment.mp4").exists()


@pytest.mark.parametrize("super_resolution", [False, True])
def test_generate_requests_that_fail_to_build_fail_the_render_as_themselves(
    tmp_path: Path, super_resolution: bool
) -> None:
    # Fewer mel windows than frames (a short segment blob): building the Generate requests fails.
    with pytest.raises(IndexError):
        render(tmp_path, Lipsync(), FRAMES - 2, super_resolution)
    assert not (tmp_path / "segment.mp4").exists()
