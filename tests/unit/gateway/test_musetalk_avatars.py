"""CreateAvatar for the musetalk tier (services.gateway.musetalk_avatars): the pack written from the
stage's answers, and the covered-mouth check's last answer.

`_Pack` is fed PrepareAvatarResponses as the stage sends them: frames whose mouth is covered lose
their box and their rows, the other faces' rows stay intact and in order. `create_musetalk_avatar`
runs against the real lipsync-musetalk stage (in-process, the stand-in) on a temporary SQLite and
folder blob store: a clip with a hand over the mouth counts fewer faces; one whose every face is
covered is INVALID_ARGUMENT (no face) and leaves nothing, as a Wav2Lip avatar without a face does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from lipline.v1 import common_pb2, lipsync_pb2, lipsync_pb2_grpc
from services.gateway.musetalk_avatars import COPY_ROWS, _Pack, create_musetalk_avatar
from services.jobs.avatars import MUSETALK_LATENTS, MUSETALK_MASKS, new_avatar_id, prefix
from services.jobs.store.jobs import AvatarRecord
from services.media.musetalk_wire import LATENT_SHAPE, MASK_SHAPE
from services.render.mp4 import Mp4Writer
from services.serving.errors import InvalidMedia
from tests.helpers.musetalk_stage import RunningStage
from tests.helpers.occluders import panning_clip
from tests.helpers.stores import Stores, temp_stores

FRAMES = 2 * COPY_ROWS + 22  # past two copy chunks
NO_FACE = {3, 90}
COVERED = [0, 1, COPY_ROWS, 70, 71, 72, 140, FRAMES - 1]  # runs at both ends, at a chunk's edge


def answer(index: int, found: bool) -> lipsync_pb2.PreparedFrame:
    """Frame `index`'s answer; its latents are all `index` and its mask all `index % 256`, to be told apart."""
    if not found:
        return lipsync_pb2.PreparedFrame(index=index, found=False)
    return lipsync_pb2.PreparedFrame(
        index=index,
        found=True,
        box=common_pb2.Box(x1=index, y1=1, x2=index + 10, y2=20),
        latents=np.full(LATENT_SHAPE, index, "<f2").tobytes(),
        mask_box=common_pb2.Box(x1=index, y1=0, x2=index + 15, y2=15),
        mask=np.full(MASK_SHAPE, index % 256, np.uint8).tobytes(),
    )


def answers(covered: list[int]) -> list[lipsync_pb2.PrepareAvatarResponse]:
    """The stage's answers for FRAMES frames (8 a message), then its last one naming `covered`."""
    responses = [
        lipsync_pb2.PrepareAvatarResponse(
            frames=[answer(i, i not in NO_FACE) for i in range(start, min(start + 8, FRAMES))]
        )
        for start in range(0, FRAMES, 8)
    ]
    return [*responses, lipsync_pb2.PrepareAvatarResponse(mouth_covered=covered)] if covered else responses


def test_covered_frames_lose_their_box_and_rows_and_the_other_rows_stay_in_order(tmp_path: Path) -> None:
    pack = _Pack(tmp_path)
    for response in answers(COVERED):
        pack.add(response)
    latents_path, masks_path = pack.finish()
    kept = [i for i in range(FRAMES) if i not in NO_FACE and i not in COVERED]
    assert pack.mouth_covered == len(COVERED) and pack.faces == len(kept)
    assert [i for i, b in enumerate(pack.boxes) if b is not None] == kept
    assert [i for i, b in enumerate(pack.mask_boxes) if b is not None] == kept
    assert pack.boxes[70] is None and pack.boxes[69] == (69, 1, 79, 20)
    latents, masks = np.load(latents_path), np.load(masks_path)
    assert latents.shape == (len(kept), *LATENT_SHAPE) and latents.dtype == np.float16
    assert masks.shape == (len(kept), *MASK_SHAPE) and masks.dtype == np.uint8
    np.testing.assert_array_equal(latents, np.broadcast_to(np.array(kept, "<f2")[:, None, None, None], latents.shape))
    np.testing.assert_array_equal(
        masks, np.broadcast_to((np.array(kept) % 256).astype(np.uint8)[:, None, None], masks.shape)
    )
    assert not (tmp_path / "latents.raw").exists() and not (tmp_path / "masks.raw").exists()


def test_without_covered_mouths_every_row_is_kept(tmp_path: Path) -> None:
    pack = _Pack(tmp_path)
    for response in answers([]):
        pack.add(response)
    latents_path, masks_path = pack.finish()
    kept = [i for i in range(FRAMES) if i not in NO_FACE]
    assert pack.mouth_covered == 0 and pack.faces == len(kept)
    np.testing.assert_array_equal(np.load(latents_path)[:, 0, 0, 0], np.array(kept, np.float16))
    np.testing.assert_array_equal(np.load(masks_path)[:, 5, 5], (np.array(kept) % 256).astype(np.uint8))


@pytest.mark.parametrize(
    "covered, problem",
    [
        ([3], "not frames answered with a face"),  # no face there
        ([FRAMES], "not frames answered with a face"),  # not a frame
        ([2, 1], "not frames answered with a face"),  # not ascending
    ],
)
def test_a_covered_frame_that_is_not_a_face_is_refused(tmp_path: Path, covered: list[int], problem: str) -> None:
    pack = _Pack(tmp_path)
    try:
        for response in answers([]):
            pack.add(response)
        with pytest.raises(RuntimeError, match=problem):
            pack.add(lipsync_pb2.PrepareAvatarResponse(mouth_covered=covered))
    finally:
        pack.close()


def test_frames_after_the_covered_mouths_are_refused(tmp_path: Path) -> None:
    pack = _Pack(tmp_path)
    try:
        pack.add(answers([])[0])
        pack.add(lipsync_pb2.PrepareAvatarResponse(mouth_covered=[0]))
        with pytest.raises(RuntimeError, match="after the covered mouths"):
            pack.add(lipsync_pb2.PrepareAvatarResponse(frames=[answer(8, True)]))
        with pytest.raises(RuntimeError, match="twice"):
            pack.add(lipsync_pb2.PrepareAvatarResponse(mouth_covered=[1]))
    finally:
        pack.close()


# --------------------------------------------------------------------------------------------------
# Through the real stage
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stage() -> Iterator[RunningStage]:
    with RunningStage() as running:
        yield running


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    with temp_stores(tmp_path) as s:
        yield s


def clip(path: Path, frames: int, covered: range | list[int]) -> bytes:
    """The sample face panning, a hand over the mouth in the `covered` frames, as an MP4 (near-lossless)."""
    images = panning_clip(frames, covered)  # type: ignore[arg-type]
    with Mp4Writer(path, 256, 256, 25.0, None, 16_000, crf=12) as writer:
        for image in images:
            writer.write(image)
    return path.read_bytes()


def create(stage: RunningStage, stores: Stores, data: bytes, aid: str) -> AvatarRecord:
    async def run() -> AvatarRecord:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{stage.service.runner.port}") as channel:
            stub = lipsync_pb2_grpc.MuseTalkServiceStub(channel)
            return await create_musetalk_avatar(stores.blobs, None, aid, data, "clip", 25.0, 100, 10**6, stub=stub)

    return asyncio.run(run())


def test_a_clip_with_a_hand_over_the_mouth_counts_fewer_faces(
    stage: RunningStage, stores: Stores, tmp_path: Path
) -> None:
    aid = new_avatar_id()
    record = create(stage, stores, clip(tmp_path / "hand.mp4", 30, range(10, 16)), aid)
    assert (record.frame_count, record.faces_found) == (30, 20)  # frames 8-17: the hand's, dilated by 2
    meta = json.loads((stores.root / prefix(aid) / "meta.json").read_text())
    assert [i for i, b in enumerate(meta["boxes"]) if b is None] == list(range(8, 18))
    assert meta["mask_boxes"][8] is None and meta["prep"]["mouth_covered"] == 10
    assert np.load(stores.root / prefix(aid) / MUSETALK_LATENTS).shape == (20, *LATENT_SHAPE)
    assert np.load(stores.root / prefix(aid) / MUSETALK_MASKS).shape == (20, *MASK_SHAPE)


def test_an_avatar_whose_every_face_is_covered_has_no_face_and_leaves_nothing(
    stage: RunningStage, stores: Stores, tmp_path: Path
) -> None:
    """8 frames (the check's least), a hand in frames 2 and 5: dilated by 2 they cover all 8."""
    with pytest.raises(InvalidMedia, match="no face found in the avatar"):
        create(stage, stores, clip(tmp_path / "hands.mp4", 8, [2, 5]), new_avatar_id())
    assert stores.blob_keys() == []
    assert create(stage, stores, clip(tmp_path / "clean.mp4", 8, []), new_avatar_id()).faces_found == 8  # no hand
