"""The internal stages refuse numbers no caller means (issue 17, item 8), with real processes on 127.0.0.1:
INVALID_ARGUMENT naming the field and its range, for the offending stream only; the stage keeps
serving everyone else.

Field families: how many items one Generate or Upscale message carries, what the images they ask
for add up to (services/inference/request_bounds.py), and the audio stage's ExtractOptions.max_seconds
(negative or NaN used to mean "no limit" silently). Every other numeric field of the internal protos
already had a check and a test (tests/integration/test_errors.py: image sizes and formats, paste
and output sizes, mel windows, speech values, fps); DetectFaces' pads are checked elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from lipline.v1 import audio_pb2, audio_pb2_grpc, lipsync_pb2, lipsync_pb2_grpc, superres_pb2, superres_pb2_grpc
from services.inference.request_bounds import MAX_OUTPUT_BYTES_PER_MESSAGE
from services.local.cluster import LocalCluster
from services.media.wire import image_to_proto, mel_to_bytes, pack_generate_items
from tests.helpers.audio_files import encode_tone
from tests.integration.util import assert_all_serving

MiB = 1 << 20
MAX_PENDING = 512  # ModelStageSettings.max_pending_per_stream, the cluster's default
FACE = np.full((96, 96, 3), 100, np.uint8)
MEL = mel_to_bytes(np.zeros((80, 16), np.float32))
SIDE = 2048  # codec.MAX_IMAGE_SIDE: the largest face any stage returns
OVER_BUDGET = MAX_OUTPUT_BYTES_PER_MESSAGE // (SIDE * SIDE * 3) + 1  # faces of 2048 x 2048 one message may not ask for


def expect_invalid(call: Callable[[], Any], *words: str) -> str:
    with pytest.raises(grpc.RpcError) as err:
        list(call())
    details = err.value.details() or ""
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.value.code(), details)
    assert "Traceback" not in details
    for word in words:
        assert word.lower() in details.lower(), (word, details)
    return details


@pytest.fixture(autouse=True)
def still_serving(cluster: LocalCluster) -> Iterator[None]:
    yield
    assert_all_serving(cluster)


def generate(stub: lipsync_pb2_grpc.LipSyncServiceStub, items: int, paste: int = 0) -> Callable[[], Any]:
    crop = lipsync_pb2.ReferenceCrop(crop_index=0, image=image_to_proto(FACE), paste_width=paste, paste_height=paste)
    requests = [
        lipsync_pb2.GenerateRequest(crops=[crop]),
        lipsync_pb2.GenerateRequest(items=pack_generate_items(list(range(items)), [0] * items, [MEL] * items)),
    ]
    return lambda: stub.Generate(iter(requests), timeout=120)


def upscale(
    stub: superres_pb2_grpc.SuperResServiceStub, items: int, side: int = 0, image: np.ndarray = FACE
) -> Callable[[], Any]:
    request = superres_pb2.UpscaleRequest(
        items=[
            superres_pb2.UpscaleItem(index=i, image=image_to_proto(image), out_width=side, out_height=side)
            for i in range(items)
        ]
    )
    return lambda: stub.Upscale(iter([request]), timeout=120)


def extract(stub: audio_pb2_grpc.AudioServiceStub, max_seconds: float) -> Callable[[], Any]:
    wav = encode_tone("wav", 1.0, rate=16000, channels=1)
    request = audio_pb2.ExtractRequest(options=audio_pb2.ExtractOptions(fps=25, max_seconds=max_seconds), data=wav)
    return lambda: stub.Extract(iter([request]), timeout=60)


def test_generate_items_per_message(lipsync_stub: lipsync_pb2_grpc.LipSyncServiceStub) -> None:
    details = expect_invalid(
        generate(lipsync_stub, MAX_PENDING + 1), "items", f"{MAX_PENDING + 1} in one message", f"at most {MAX_PENDING}"
    )
    assert "max_pending_per_stream" in details
    (ok,) = list(generate(lipsync_stub, 10)())  # what the render workers send: served as before
    assert len(ok.faces.frame_indices) == 10


def test_generate_output_bytes_per_message(lipsync_stub: lipsync_pb2_grpc.LipSyncServiceStub) -> None:
    expect_invalid(generate(lipsync_stub, OVER_BUDGET, paste=SIDE), "bytes", "256 MiB", "fewer items")


def test_upscale_items_per_message(superres_stub: superres_pb2_grpc.SuperResServiceStub) -> None:
    dot = np.zeros((1, 1, 3), np.uint8)  # a 64 MiB message holds millions of these, each asking for a face
    expect_invalid(upscale(superres_stub, MAX_PENDING + 1, side=96, image=dot), "items", f"at most {MAX_PENDING}")
    (ok,) = list(upscale(superres_stub, 10, side=96)())
    assert len(ok.items) == 10


def test_upscale_output_bytes_per_message(superres_stub: superres_pb2_grpc.SuperResServiceStub) -> None:
    expect_invalid(upscale(superres_stub, OVER_BUDGET, side=SIDE), "bytes", "256 MiB")


@pytest.mark.parametrize("max_seconds", [-1.0, float("nan"), -1e300])
def test_extract_max_seconds(audio_stub: audio_pb2_grpc.AudioServiceStub, max_seconds: float) -> None:
    expect_invalid(extract(audio_stub, max_seconds), "max_seconds", ">= 0")
    responses = list(extract(audio_stub, 0.0)())  # unset: the stage's own limit
    assert responses[0].total_frames == 25
