"""The lipsync-musetalk stage through gRPC (a real server on 127.0.0.1, the weight-free stand-in on the
CPU): a stream's LatentBank and audio windows in, 256 x 256 faces out that move with speech and stay
still in silence; a bad message ends its own stream INVALID_ARGUMENT, never another's."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import cv2
import grpc
import numpy as np
import pytest
import torch

from lipline.v1 import lipsync_pb2
from services.lipsync.musetalk.standin import LATENT_SCALE, StandInVAE
from services.media.musetalk_wire import pack_items, pack_latents, pack_window
from tests.helpers.musetalk_stage import RunningStage
from tests.integration.util import SAMPLES

FLOOR = -0.71  # whisper's scaled log-mel floor of a window whose top is 1.29 (top - 2)


def face_latents() -> np.ndarray:
    """The sample avatar's face, 256 x 256, through the stand-in VAE as avatar preparation encodes it."""
    image = cv2.imread(str(SAMPLES / "avatar.jpg"))
    crop = cv2.resize(image[75:180, 178:270], (256, 256), interpolation=cv2.INTER_LANCZOS4)
    x = torch.from_numpy(crop[:, :, ::-1].copy()).permute(2, 0, 1)[None].float() / 127.5 - 1.0
    masked = x.clone()
    masked[:, :, 128:] = -1.0
    vae = StandInVAE()
    latents = torch.cat([vae.encode(masked)[0], vae.encode(x)[0]], dim=1) * LATENT_SCALE
    return latents.numpy().astype(np.float16)


def speech_then_silence() -> np.ndarray:
    """A window's log-mel: 10 s of speech-like columns (syllables: loudness rising and falling 3 times a
    second), then silence at the floor."""
    mel = np.full((80, 3000), FLOOR, np.float32)
    rng = np.random.default_rng(0)
    syllables = np.sin(np.arange(1000) * np.pi * 3 / 100) ** 2  # 0..1
    mel[:, :1000] = FLOOR + 2.0 * syllables * rng.uniform(0.5, 1.0, (80, 1000))
    return mel


@pytest.fixture(scope="module")
def stage() -> Iterator[RunningStage]:
    with RunningStage(max_pending_per_stream=64, max_latents_per_stream=16) as running:
        yield running


def good_stream(frames: list[int]) -> list[lipsync_pb2.MuseTalkGenerateRequest]:
    """Latents once, the window once, then items a few per message; 25 fps: frame i at offset 2i - 4."""
    first = lipsync_pb2.MuseTalkGenerateRequest(
        latents=pack_latents([0], face_latents()), windows=[pack_window(0, speech_then_silence()[:, :1200], FLOOR)]
    )
    messages = [first]
    for start in range(0, len(frames), 4):
        part = frames[start : start + 4]
        messages.append(
            lipsync_pb2.MuseTalkGenerateRequest(
                items=pack_items(part, [0] * len(part), [0] * len(part), [2 * i - 4 for i in part])
            )
        )
    return messages


def test_faces_move_with_speech_and_are_still_in_silence(stage: RunningStage) -> None:
    speech, silence = list(range(100, 109)), [400, 450, 500, 600]  # speech ends at frame 250 (10 s)
    frames, faces, model = stage.generate(good_stream(speech + silence))
    assert frames == speech + silence and model == "musetalk-standin"
    still = faces[len(speech) :]
    assert all(np.array_equal(f, still[0]) for f in still)  # silence: the same face on every frame
    moving = faces[: len(speech)]
    changed = [np.abs(f.astype(int) - still[0]).max(axis=2) > 8 for f in moving]
    assert sum(c.any() for c in changed) >= 6  # the mouth opens on most speech frames (closes between syllables)...
    assert len({int(c.sum()) for c in changed}) > 4  # ...by different amounts
    rows, cols = np.nonzero(np.logical_or.reduce(changed))
    assert rows.min() > 150 and rows.max() < 215 and cols.min() > 85 and cols.max() < 170  # only at the mouth
    # the face itself is the sample's (blurred): skin-coloured around the mouth, not noise or black
    assert 60 < still[0][100:150, 100:156].mean() < 230


def expect_invalid(stage: RunningStage, requests: list[lipsync_pb2.MuseTalkGenerateRequest], message: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stage.generate(requests)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert message in (err.value.details() or ""), err.value.details()


def item(frame: int, latent: int = 0, window: int = 0, offset: int = 0) -> lipsync_pb2.MuseTalkGenerateRequest:
    return lipsync_pb2.MuseTalkGenerateRequest(items=pack_items([frame], [latent], [window], [offset]))


def test_a_bad_message_ends_only_its_own_stream(stage: RunningStage) -> None:
    start = good_stream([])[0]
    short = lipsync_pb2.LatentBank(latent_indices=[0], latents=b"\0" * 100)
    bad = {
        "latents: 1 indices need 16384 bytes (8x32x32 float16 each), got 100": [
            lipsync_pb2.MuseTalkGenerateRequest(latents=short)
        ],
        "item for frame 3 names latent 9, which this stream has not sent": [start, item(3, latent=9)],
        "item for frame 4 names audio window 2, which this stream has not sent": [start, item(4, window=2)],
        "the offset of frame 5 is 5000; it must be in -3000..3000": [start, item(5, offset=5000)],
        "audio window 1: columns is 3001; it must be in 1..3000": [
            lipsync_pb2.MuseTalkGenerateRequest(
                windows=[lipsync_pb2.AudioWindow(window_index=1, columns=3001, positions=10)]
            )
        ],
        "audio window 1: 2 columns need 320 bytes": [
            lipsync_pb2.MuseTalkGenerateRequest(
                windows=[lipsync_pb2.AudioWindow(window_index=1, columns=2, positions=10, log_mel=b"\0" * 10)]
            )
        ],
        "items: 65 in one message; at most 64": [
            start,
            lipsync_pb2.MuseTalkGenerateRequest(items=pack_items(range(65), [0] * 65, [0] * 65, [0] * 65)),
        ],
        "items: 2 frame indices, 1 latent indices": [
            start,
            lipsync_pb2.MuseTalkGenerateRequest(
                items=lipsync_pb2.MuseTalkItems(
                    frame_indices=[1, 2], latent_indices=[0], window_indices=[0, 0], offsets=[0, 0]
                )
            ),
        ],
    }
    results: dict[str, object] = {}

    def good() -> None:
        results["good"] = stage.generate(good_stream(list(range(0, 60, 3))))

    thread = threading.Thread(target=good)
    thread.start()
    for message, requests in bad.items():
        expect_invalid(stage, requests, message)
    thread.join(120)
    frames, faces, _ = results["good"]  # type: ignore[misc]
    assert frames == list(range(0, 60, 3)) and faces.shape == (20, 256, 256, 3)
    alone = stage.generate(good_stream(list(range(0, 60, 3))))[1]
    assert np.array_equal(faces, alone)  # the bad streams beside it changed nothing


def test_too_many_latents_or_window_positions_are_resource_exhausted(stage: RunningStage) -> None:
    latents = np.zeros((17, 8, 32, 32), np.float16)
    with pytest.raises(grpc.RpcError) as err:
        stage.generate([lipsync_pb2.MuseTalkGenerateRequest(latents=pack_latents(range(17), latents))])
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "more than 16 latents" in (
        err.value.details() or ""
    )
    windows = [pack_window(i, np.zeros((80, 1)), FLOOR) for i in range(22)]  # 22 x 1500 > 32000 positions
    with pytest.raises(grpc.RpcError) as err:
        stage.generate([lipsync_pb2.MuseTalkGenerateRequest(windows=windows)])
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_window_positions" in (
        err.value.details() or ""
    )
