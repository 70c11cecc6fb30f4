"""A segment's stage streams (services.render.segment.SegmentRenderer) when their requests fail: the
failure reaches `render` as itself, never as a bare cancel (issue 29). Stand-in lipsync and superres
stages run on 127.0.0.1 in this event loop; the avatar is a small one built here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import av
import grpc
import numpy as np
import pytest

from lipline.v1 import common_pb2, lipsync_pb2, lipsync_pb2_grpc, superres_pb2_grpc
from services.jobs.avatar_cache import LocalAvatar
from services.jobs.avatars import AvatarMeta
from services.jobs.segment_audio import SegmentAudio
from services.lipsync.musetalk.masks import mask_box
from services.media.composite import AlphaMasks, Compositor, I420Frames
from services.media.musetalk_wire import pack_window
from services.media.packed import PackedImages
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
async def renderer(lipsync: Lipsync | None = None, musetalk: MuseTalk | None = None) -> AsyncIterator[SegmentRenderer]:
    """A SegmentRenderer whose stages (these fakes, and a superres) serve on one local gRPC server."""
    server = grpc.aio.server()
    if lipsync is not None:
        lipsync_pb2_grpc.add_LipSyncServiceServicer_to_server(lipsync, server)
    if musetalk is not None:
        lipsync_pb2_grpc.add_MuseTalkServiceServicer_to_server(musetalk, server)
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
                musetalk=lipsync_pb2_grpc.MuseTalkServiceStub(channel) if musetalk is not None else None,
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
    # The stage's own status; or, when the abort lands while a request is being written (a race a loaded
    # machine hits), gRPC core's INTERNAL "Internal error from Core" for that call: still lipsync's.
    assert failed.value.code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL), failed.value
    assert not (tmp_path / "segment.mp4").exists()


@pytest.mark.parametrize("super_resolution", [False, True])
def test_generate_requests_that_fail_to_build_fail_the_render_as_themselves(
    tmp_path: Path, super_resolution: bool
) -> None:
    # Fewer mel windows than frames (a short segment blob): building the Generate requests fails.
    with pytest.raises(IndexError):
        render(tmp_path, Lipsync(), FRAMES - 2, super_resolution)
    assert not (tmp_path / "segment.mp4").exists()


# --------------------------------------------------------------------------------------------------
# A musetalk avatar's segment: what goes to lipsync-musetalk, and what the gate leaves out
# --------------------------------------------------------------------------------------------------


class MuseTalk(lipsync_pb2_grpc.MuseTalkServiceServicer):
    """Records Generate's requests and answers every item with a white 256x256 face."""

    def __init__(self) -> None:
        self.requests: list[lipsync_pb2.MuseTalkGenerateRequest] = []

    async def Generate(self, request_iterator, context):
        async for request in request_iterator:
            self.requests.append(request)
            frames = list(request.items.frame_indices)
            if frames:
                faces = PackedImages.from_arrays([np.full((256, 256, 3), 255, np.uint8)] * len(frames))
                yield lipsync_pb2.GenerateResponse(
                    faces=faces.to_pb(frames, list(request.items.latent_indices)),
                    model=common_pb2.ModelInfo(name="musetalk-standin", backend="cpu", precision="fp32"),
                )


def musetalk_avatar(frames: int) -> LocalAvatar:
    """A `frames`-frame musetalk avatar whose frame 1 has no face; its mask is 255 in the square's lower half."""
    boxes: list = [BOX if i != 1 else None for i in range(frames)]
    squares: list = [mask_box(BOX) if b is not None else None for b in boxes]
    meta = AvatarMeta("m1", "ann", 25.0, 0.0, frames, SIDE, SIDE, boxes, 0.0, model="musetalk", mask_boxes=squares)
    rows = {f: r for r, f in enumerate(meta.crop_frames)}
    latents = np.stack([np.full((8, 32, 32), r, np.float16) for r in range(len(rows))])
    masks = np.zeros((len(rows), 256, 256), np.uint8)
    masks[:, 128:] = 255
    i420 = I420Frames(np.full((frames, SIDE * 3 // 2, SIDE), 16, np.uint8))
    compositor = Compositor(i420, boxes, alpha=AlphaMasks(masks, squares, rows))
    return LocalAvatar(meta, np.zeros((0, 96, 96, 3), np.uint8), rows, compositor, latents)


def test_a_musetalk_segment_sends_latents_and_windows_once_and_gates_silent_frames(tmp_path: Path) -> None:
    avatar = musetalk_avatar(4)
    start, end = 3, 9  # output frames 3..8 over the 4-frame template, ping-pong: 3 2 1 0 1 2
    speech = np.array([0.0, 0.5, 1.0, 0.05, 1.0, 0.0], np.float16)  # gate: 0, 1, 1, 1/6, 1, 0
    audio = SegmentAudio(None, speech)
    window = pack_window(0, np.zeros((80, 10), np.float16), -1.5, positions=120)
    stage = MuseTalk()

    async def run() -> None:
        async with renderer(musetalk=stage) as segments:
            result = await segments.render(
                avatar, start, end, audio, False, 10, tmp_path / "s.mp4", whisper=[window], whisper_windows=1
            )
        assert result.models == [{"name": "musetalk-standin", "backend": "cpu", "precision": "fp32"}]

    asyncio.run(asyncio.wait_for(run(), 60))
    banks = [r.latents for r in stage.requests if r.HasField("latents")]
    windows = [w for r in stage.requests for w in r.windows]
    items = [r.items for r in stage.requests if r.items.frame_indices]
    # Template frames 3 2 1 0 1 2 (ping-pong over 4): faces are asked for output frames 4 and 6 only,
    # 3 and 8 being silent (gate 0) and 5 and 7 showing template frame 1, which has no face.
    assert [list(i.frame_indices) for i in items] == [[4, 6]]
    assert list(items[0].latent_indices) == [2, 0]
    assert [list(b.latent_indices) for b in banks] == [[0, 2]]  # the latents those use, once
    assert windows == [window]
    assert list(items[0].window_indices) == [0, 0]
    assert list(items[0].offsets) == [2 * 4 - 4, 2 * 6 - 4]  # upstream's first positions at 25 fps
    with av.open(str(tmp_path / "s.mp4")) as container:
        lumas = [f.to_ndarray(format="gray") for f in container.decode(video=0)]
    lower = (slice(40, 54), slice(12, 52))  # the box's lower half, where the mask is 255
    levels = [float(y[lower].mean()) for y in lumas]
    assert all(levels[k] < 30 for k in (0, 2, 4, 5)), levels  # silent or faceless: the template (16)
    assert levels[1] > 200, levels  # the white face through the mask
    assert 30 < levels[3] < 100, levels  # a sixth of it: the gate fading it in
    assert max(float(y[8:24, 8:56].mean()) for y in lumas) < 30  # the box's upper part stays the template's
