"""Every stage response fits under the message limit, whatever the paste size or the batching asked for.

The stages cut their streaming responses by bytes (half of `max_message_bytes` per message, as the
clients cut their requests), not by item count: a close-up photo's faces at paste size are megabytes
each, 8 faces upscaled to 2048x2048 are 100 MB, and a client may ask the audio stage for 100,000 mel
windows per message. Before, each of these ended "Sent message larger than max". All on a cluster of
real processes with the default limits (64 MiB messages).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import av
import cv2
import grpc
import numpy as np
import pytest

from lipline.v1 import (
    audio_pb2,
    audio_pb2_grpc,
    gateway_pb2,
    lipsync_pb2,
    lipsync_pb2_grpc,
    superres_pb2,
    superres_pb2_grpc,
)
from services.gateway.client import LiplineClient
from services.lipsync.faces import DEFAULT_PADS, HaarFaceDetector, prepare_boxes
from services.local.cluster import LocalCluster
from services.media.packed import PackedImages
from services.media.wire import image_to_proto, pack_generate_items
from services.serving.channels import channel_options
from services.serving.settings import ServiceSettings
from services.serving.streams import byte_ranges, message_budget
from tests.helpers.audio_files import pcm_wav
from tests.integration.util import SAMPLES, cut_wav, start_cluster

LIMIT = ServiceSettings().max_message_bytes  # the default every process of the cluster runs with
BUDGET = message_budget(LIMIT)
HEADROOM = 4096  # field tags, sizes, ModelInfo: far less than the other half of the limit
CLOSE_UP = 1080
SPEECH_S = 2.0


def close_up_photo() -> tuple[bytes, tuple[int, int]]:
    """A 1080x1080 JPEG of the sample face cropped tightly: (the file, the padded face box's size)."""
    image = cv2.imread(str(SAMPLES / "avatar.jpg"))
    ((x1, y1, x2, y2),) = HaarFaceDetector().detect([image])
    cx, cy, side = (x1 + x2) // 2, (y1 + y2) // 2, round(1.2 * max(x2 - x1, y2 - y1))
    crop = image[cy - side // 2 : cy - side // 2 + side, cx - side // 2 : cx - side // 2 + side]
    photo = cv2.resize(crop, (CLOSE_UP, CLOSE_UP), interpolation=cv2.INTER_CUBIC)
    (box,) = prepare_boxes(HaarFaceDetector().detect([photo]), CLOSE_UP, CLOSE_UP, DEFAULT_PADS, False)
    assert box is not None, "the close-up has no detectable face"
    ok, jpeg = cv2.imencode(".jpg", photo, [cv2.IMWRITE_JPEG_QUALITY, 92])
    assert ok
    return jpeg.tobytes(), (box[2] - box[0], box[3] - box[1])


def video_frames(data: bytes, tmp_path: Path) -> tuple[int, int, int]:
    """(decoded frames, width, height) of an MP4."""
    path = tmp_path / "out.mp4"
    path.write_bytes(data)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        count = sum(1 for _ in container.decode(video=0))
        return count, stream.codec_context.width, stream.codec_context.height


@pytest.fixture(scope="module")
def fcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Default limits everywhere; 1 s segments so a job is a few segments and a join.
    with start_cluster(tmp_path_factory.mktemp("fit"), extra_args={"gateway": ["--segment-seconds=1"]}) as cluster:
        yield cluster


def _faces(response: lipsync_pb2.GenerateResponse) -> list[tuple[int, np.ndarray]]:
    return list(zip(response.faces.frame_indices, PackedImages.from_pb(response.faces).arrays()))


def _channel(cluster: LocalCluster, name: str) -> grpc.Channel:
    return grpc.insecure_channel(cluster.processes[name].address, options=channel_options(LIMIT))


def test_byte_ranges_cut_in_order_and_a_large_item_goes_alone() -> None:
    assert byte_ranges([], 10) == []
    assert byte_ranges([4, 4, 4, 4], 10) == [(0, 2), (2, 4)]
    assert byte_ranges([3, 30, 3, 3], 10) == [(0, 1), (1, 2), (2, 4)]
    assert byte_ranges([4, 4, 4], 10, overhead=1) == [(0, 2), (2, 3)]
    assert byte_ranges([5] * 7, 100) == [(0, 7)]


def test_response_builders_cut_by_bytes_and_keep_the_packed_form() -> None:
    """The servicers' builders without a server: mixed paste sizes, a face larger than the budget."""
    from services.inference.stage import cut_responses
    from services.lipsync.service import FACE_OVERHEAD, generated_response
    from services.superres.service import ITEM_OVERHEAD, upscale_response

    def generated_responses(frames: list[int], crops: list[int], faces: PackedImages, budget: int) -> list:
        return list(cut_responses((frames, crops), faces, budget, FACE_OVERHEAD, generated_response))

    def upscale_responses(indices: list[int], images: PackedImages, budget: int) -> list:
        return list(cut_responses((indices,), images, budget, ITEM_OVERHEAD, upscale_response))

    rng = np.random.default_rng(1)
    sizes = [(40, 30), (200, 180), (40, 30), (40, 30), (10, 10)]
    arrays = [rng.integers(0, 256, (h, w, 3), np.uint8) for w, h in sizes]
    faces = PackedImages.from_arrays(arrays)
    budget = 12_000  # 3 small faces; the 200x180 one (108 kB) alone
    responses = generated_responses([5, 6, 7, 8, 9], [0, 1, 0, 0, 2], faces, budget)
    assert [list(r.faces.frame_indices) for r in responses] == [[5], [6], [7, 8, 9]]
    assert [list(r.faces.crop_indices) for r in responses] == [[0], [1], [0, 0, 2]]
    got = [face for r in responses for face in _faces(r)]
    assert [i for i, _ in got] == [5, 6, 7, 8, 9] and all((f == a).all() for (_, f), a in zip(got, arrays))
    (whole,) = generated_responses([5, 6, 7, 8, 9], [0, 1, 0, 0, 2], faces, 10**9)
    assert whole.faces.data == faces.data

    images = PackedImages.from_arrays(arrays)
    ups = upscale_responses([1, 2, 3, 4, 5], images, budget)
    assert [[i.index for i in r.items] for r in ups] == [[1], [2], [3, 4, 5]]
    assert [i.image.data for r in ups for i in r.items] == [a.tobytes() for a in arrays]
    (empty,) = upscale_responses([], PackedImages([], [], b""), budget)
    assert len(empty.items) == 0


@pytest.mark.parametrize("super_resolution", [False, True], ids=["paste-size", "super-resolution"])
def test_close_up_photo_renders(fcluster: LocalCluster, super_resolution: bool, tmp_path: Path) -> None:
    photo, (box_w, box_h) = close_up_photo()
    assert 800 <= max(box_w, box_h) <= 1000, (box_w, box_h)  # ~2.3 MB per face at paste size
    audio = cut_wav((SAMPLES / "speech.wav").read_bytes(), SPEECH_S)
    with LiplineClient(fcluster.gateway_address, timeout=300) as client:
        avatar = client.create_avatar(photo, name="close-up")
        assert (avatar.width, avatar.height, avatar.faces_found) == (CLOSE_UP, CLOSE_UP, 1)
        job = client.submit_job(avatar.id, audio, super_resolution=super_resolution)
        done = client.wait(job.id)
        assert done.state == gateway_pb2.JOB_STATE_SUCCEEDED, done.error
        assert abs(done.total_frames - SPEECH_S * avatar.fps) <= 1, (done.total_frames, avatar.fps)
        output = tmp_path / "close-up.mp4"
        client.download(job.id, output)
    assert video_frames(output.read_bytes(), tmp_path) == (done.total_frames, CLOSE_UP, CLOSE_UP)


def test_generate_answers_a_message_of_large_faces_in_several_responses(fcluster: LocalCluster) -> None:
    """10 items pasted at 2048x2048 (126 MB in all) in one request message: several responses, in order."""
    n, side = 10, 2048
    crop = np.full((96, 96, 3), 128, np.uint8)
    mel = np.full((80, 16), -4.0, "<f2").tobytes()
    requests = [
        lipsync_pb2.GenerateRequest(
            crops=[
                lipsync_pb2.ReferenceCrop(crop_index=7, image=image_to_proto(crop), paste_width=side, paste_height=side)
            ]
        ),
        lipsync_pb2.GenerateRequest(items=pack_generate_items(list(range(100, 100 + n)), [7] * n, [mel] * n)),
    ]
    with _channel(fcluster, "lipsync") as channel:
        responses = list(lipsync_pb2_grpc.LipSyncServiceStub(channel).Generate(iter(requests), timeout=120))
    assert len(responses) > 1 and responses[0].HasField("model")
    assert all(r.ByteSize() <= BUDGET + HEADROOM for r in responses), [r.ByteSize() for r in responses]
    faces = [face for r in responses for face in _faces(r)]
    assert [i for i, _ in faces] == list(range(100, 100 + n))
    assert all(f.shape == (side, side, 3) for _, f in faces)


def test_upscale_answers_eight_items_at_2048_in_several_responses(fcluster: LocalCluster) -> None:
    n, side = 8, 2048
    rng = np.random.default_rng(0)
    items = [
        superres_pb2.UpscaleItem(
            index=i, image=image_to_proto(rng.integers(0, 256, (96, 96, 3), np.uint8)), out_width=side, out_height=side
        )
        for i in range(n)
    ]
    with _channel(fcluster, "superres") as channel:
        responses = list(
            superres_pb2_grpc.SuperResServiceStub(channel).Upscale(
                iter([superres_pb2.UpscaleRequest(items=items)]), timeout=120
            )
        )
    assert len(responses) > 1 and responses[0].HasField("model")
    assert all(r.ByteSize() <= BUDGET + HEADROOM for r in responses), [r.ByteSize() for r in responses]
    got = [item for r in responses for item in r.items]
    assert [g.index for g in got] == list(range(n))
    assert all((g.image.width, g.image.height, len(g.image.data)) == (side, side, side * side * 3) for g in got)


def _tone_wav(seconds: float, rate: int = 16_000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return pcm_wav(0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2, rate)


def test_extract_caps_windows_per_message_by_bytes(fcluster: LocalCluster) -> None:
    """300 s at 120 fps is 36,000 windows (92 MB): asked for 100,000 per message, they come in several."""
    data, fps = _tone_wav(300.0), 120.0
    chunk = 1 << 20

    def requests() -> Iterator[audio_pb2.ExtractRequest]:
        yield audio_pb2.ExtractRequest(
            options=audio_pb2.ExtractOptions(fps=fps, windows_per_message=100_000), data=data[:chunk]
        )
        for start in range(chunk, len(data), chunk):
            yield audio_pb2.ExtractRequest(data=data[start : start + chunk])

    with _channel(fcluster, "audio") as channel:
        responses = list(audio_pb2_grpc.AudioServiceStub(channel).Extract(requests(), timeout=300))
    total = responses[0].total_frames
    assert total == 36_000
    assert len(responses) > 1
    assert all(r.ByteSize() <= BUDGET + HEADROOM for r in responses), [r.ByteSize() for r in responses]
    assert [w.frame_index for r in responses for w in r.windows] == list(range(total))
