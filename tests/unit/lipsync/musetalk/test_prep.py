"""Avatar preparation for the musetalk tier through the stage's PrepareAvatar (a real server on
127.0.0.1, the weight-free stand-in, boxes from the face detector): a photo and a short video give
per frame a box at the face, the stand-in VAE's latents of its 256 x 256 Lanczos crop and an alpha
over the lower face; frames without a face pass through; bad streams are refused. The covered-mouth
check: a template clip with a hand over the mouth in some frames gets a last response naming exactly
those frames and their dilation; a clip without a hand, a photo, a clip under min_frames faces and a
stage with occlusion_check off name none.

The detector's box becomes a MuseTalk box through services/lipsync/musetalk/dwpose.py (its own
branch): without that module these tests are skipped."""

from __future__ import annotations

from collections.abc import Iterator

import cv2
import grpc
import numpy as np
import pytest
import torch

from lipline.v1 import lipsync_pb2
from services.lipsync.musetalk.standin import LATENT_SCALE, StandInVAE
from services.lipsync.occlusion import OcclusionConfig
from services.media.wire import image_to_proto
from tests.helpers.musetalk_stage import RunningStage
from tests.helpers.occluders import SAMPLE_FACE, hand, panning_clip
from tests.integration.util import SAMPLES

pytest.importorskip("services.lipsync.musetalk.dwpose", reason="the MuseTalk box rules (musetalk-dwpose's module)")

PHOTO = cv2.imread(str(SAMPLES / "avatar.jpg"))
FACE_CENTRE = (223, 118)  # the sample's face (OpenCV's Haar box 177..270 x 67..169)


@pytest.fixture(scope="module")
def stage() -> Iterator[RunningStage]:
    with RunningStage(max_prepare_frames=8) as running:
        yield running


def prepare(stage: RunningStage, messages: list[list[np.ndarray]]) -> list[lipsync_pb2.PrepareAvatarResponse]:
    requests, index = [], 0
    for frames in messages:
        items = [lipsync_pb2.IndexedFrame(index=index + i, image=image_to_proto(f)) for i, f in enumerate(frames)]
        index += len(frames)
        requests.append(lipsync_pb2.PrepareAvatarRequest(frames=items))
    return list(stage.stub.PrepareAvatar(iter(requests), timeout=60))


def standin_latents(frame: np.ndarray, box: lipsync_pb2.PreparedFrame) -> np.ndarray:
    """What the stage should have encoded: the box's Lanczos crop through the stand-in VAE, computed here."""
    b = box.box
    crop = cv2.resize(frame[b.y1 : b.y2, b.x1 : b.x2], (256, 256), interpolation=cv2.INTER_LANCZOS4)
    x = torch.from_numpy(crop[:, :, ::-1].copy()).permute(2, 0, 1)[None].float() / 255.0 * 2 - 1
    masked = x.clone()
    masked[:, :, 128:] = -1
    vae = StandInVAE()
    return (torch.cat([vae.encode(masked)[0], vae.encode(x)[0]], 1)[0] * LATENT_SCALE).numpy().astype(np.float16)


def test_a_photo_gets_a_box_latents_and_a_lower_face_alpha(stage: RunningStage) -> None:
    (response,) = prepare(stage, [[PHOTO]])
    assert response.model.name == "face-detector+musetalk-standin+ellipse" and response.box_source == "face-detector"
    (frame,) = response.frames
    b = frame.box
    assert frame.found and b.x1 < FACE_CENTRE[0] < b.x2 and b.y1 < FACE_CENTRE[1] < b.y2
    assert 60 < b.x2 - b.x1 < 140 and 80 < b.y2 - b.y1 < 200  # a face's size, taller than wide (chin + 10 px)
    latents = np.frombuffer(frame.latents, "<f2").reshape(8, 32, 32)
    np.testing.assert_array_equal(latents, standin_latents(PHOTO, frame))
    assert (latents[:4, 16:] == np.float16(-LATENT_SCALE)).all()  # the masked half: black (-1) x 0.18215
    mask = np.frombuffer(frame.mask, np.uint8).reshape(256, 256)
    assert (
        not mask[:100].any() and mask[150:].max() == 255
    )  # below the middle row (the blur spreads a little) and 0 < (mask > 0).mean() < 0.5
    m = frame.mask_box
    assert m.x2 - m.x1 == m.y2 - m.y1 >= 1.5 * max(b.x2 - b.x1, b.y2 - b.y1) - 2  # the 1.5x square
    assert m.x1 < b.x1 and m.y1 < b.y1 and m.x2 > b.x2 and m.y2 > b.y2


def test_a_video_is_answered_message_by_message_and_faceless_frames_pass_through(stage: RunningStage) -> None:
    shifted = [np.roll(PHOTO, 6 * i, axis=1) for i in range(4)]
    blank = np.full_like(PHOTO, 90)
    responses = prepare(stage, [shifted[:2], [blank, shifted[2]], [shifted[3], blank]])
    assert len(responses) == 3 and responses[0].model.name and not responses[1].model.name
    frames = [f for r in responses for f in r.frames]
    assert [f.index for f in frames] == list(range(6)) and [f.found for f in frames] == [True, True, False] + [
        True
    ] * 2 + [False]
    assert not frames[2].latents and not frames[2].mask  # nothing for a frame without a face
    lefts = [frames[i].box.x1 for i in (0, 1, 3, 4)]
    assert lefts == sorted(lefts) and lefts[-1] - lefts[0] >= 12  # the box follows the face


def expect(stage: RunningStage, messages: list[list[np.ndarray]], code: grpc.StatusCode, text: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        prepare(stage, messages)
    assert err.value.code() == code and text in (err.value.details() or ""), err.value.details()


def test_bad_streams_are_refused(stage: RunningStage) -> None:
    expect(stage, [[PHOTO] * 9], grpc.StatusCode.RESOURCE_EXHAUSTED, "more than 8 frames in one PrepareAvatar stream")
    expect(
        stage,
        [[PHOTO, PHOTO[:256]]],
        grpc.StatusCode.INVALID_ARGUMENT,
        "all frames of one stream must have the same size",
    )
    expect(stage, [], grpc.StatusCode.INVALID_ARGUMENT, "PrepareAvatar received no frames")
    wrong = lipsync_pb2.PrepareAvatarRequest(frames=[lipsync_pb2.IndexedFrame(index=3, image=image_to_proto(PHOTO))])
    with pytest.raises(grpc.RpcError) as err:
        list(stage.stub.PrepareAvatar(iter([wrong]), timeout=60))
    assert (
        err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        and "frame index 3 where 0 was expected" in err.value.details()
    )


# --------------------------------------------------------------------------------------------------
# The covered-mouth check (docs/architecture.md section 12.4, step 5)
# --------------------------------------------------------------------------------------------------

COVERED = range(10, 16)  # the hand's frames of a 30-frame clip
DILATE = OcclusionConfig().dilate


@pytest.fixture(scope="module")
def checking() -> Iterator[RunningStage]:
    """A stage with the default settings (the check on, up to 3000 frames a stream)."""
    with RunningStage() as running:
        yield running


def by_eights(frames: list[np.ndarray]) -> list[list[np.ndarray]]:
    return [frames[i : i + 8] for i in range(0, len(frames), 8)]


def covered_of(responses: list[lipsync_pb2.PrepareAvatarResponse], frames: int) -> list[int]:
    """The frames a stream's last response names covered (every frame answered found before it)."""
    answered = [f for r in responses for f in r.frames]
    assert [f.index for f in answered] == list(range(frames)) and all(f.found for f in answered)
    named = [r for r in responses if r.mouth_covered]
    if not named:
        return []
    assert named == [responses[-1]] and not responses[-1].frames  # once, last, a response of its own
    return list(responses[-1].mouth_covered)


def test_a_hand_over_the_mouth_is_named_once_the_frames_end(checking: RunningStage) -> None:
    responses = prepare(checking, by_eights(panning_clip(30, COVERED)))
    assert len(responses) == 5  # 4 messages' answers, then the covered frames
    expected = list(range(COVERED.start - DILATE, COVERED.stop + DILATE))
    assert covered_of(responses, 30) == expected


def test_a_clip_without_a_hand_a_photo_and_a_short_clip_name_none(checking: RunningStage) -> None:
    assert covered_of(prepare(checking, by_eights(panning_clip(30))), 30) == []
    covered_photo = hand(PHOTO, SAMPLE_FACE, top=0.62, bottom=0.3, right=0.0)
    assert covered_of(prepare(checking, [[covered_photo]]), 1) == []  # one frame: nothing to compare with
    short = panning_clip(OcclusionConfig().min_frames - 1, range(2, 5))  # fewer faces than min_frames
    assert covered_of(prepare(checking, by_eights(short)), len(short)) == []


def test_occlusion_check_off_names_none() -> None:
    with RunningStage(occlusion_check=False) as unchecked:
        assert covered_of(prepare(unchecked, by_eights(panning_clip(30, COVERED))), 30) == []
