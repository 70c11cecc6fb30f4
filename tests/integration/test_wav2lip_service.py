"""The lipsync stage with a real Wav2Lip checkpoint file (synthetic weights, the public file's layout).

The checkpoint is written the way upstream's training script saves it (`state_dict` with DataParallel's
`module.` prefix, plus optimizer/step/epoch entries) and filled with the deterministic
`seeded_state_dict` weights, so what the service computes can be checked against the model run here.
The weights use scale 0.035 instead of the default 0.02: at 0.02 every output pixel is sigmoid(~0) =
126..129, so "equal within one level" would hold for almost any computation; at 0.035 the faces span
55..252 and depend on the mel window, and no pixel saturates.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from lipline.v1 import gateway_pb2, lipsync_pb2, lipsync_pb2_grpc
from services.gateway.client import LiplineClient
from services.inference.checkpoints import seeded_state_dict
from services.lipsync import prep
from services.lipsync.faces import HaarFaceDetector, prepare_boxes
from services.lipsync.wav2lip import Wav2Lip, load_wav2lip
from services.local.cluster import LocalCluster
from services.media.audio import decode_audio
from services.media.decode import decode_avatar
from services.media.mel import MelExtractor
from services.media.packed import PackedImages
from services.media.probe import probe_media
from services.media.wire import image_to_proto, mel_from_bytes, mel_to_bytes, pack_generate_items
from tests.integration.util import SAMPLES, cut_wav, start_cluster

pytestmark = pytest.mark.slow
WEIGHT_SCALE = 0.035


def write_checkpoint(path: Path, state_dict: dict[str, torch.Tensor]) -> Path:
    torch.save({"state_dict": state_dict, "optimizer": {}, "global_step": 0, "global_epoch": 0}, path)
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    weights = {"module." + k: v for k, v in seeded_state_dict(Wav2Lip(), scale=WEIGHT_SCALE).items()}
    return write_checkpoint(tmp_path_factory.mktemp("weights") / "wav2lip.pth", weights)


@pytest.fixture(scope="module")
def w2l_cluster(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Iterator[LocalCluster]:
    extra = {"lipsync": [f"--checkpoint={checkpoint}", "--device=cpu"]}
    with start_cluster(tmp_path_factory.mktemp("w2l-cluster"), extra_args=extra) as c:
        yield c


@pytest.fixture(scope="module")
def one_second() -> bytes:
    return cut_wav((SAMPLES / "speech.wav").read_bytes(), 1.0)


def test_job_with_wav2lip(w2l_cluster: LocalCluster, avatar_bytes: bytes, one_second: bytes, tmp_path: Path) -> None:
    with LiplineClient(w2l_cluster.gateway_address, timeout=120.0) as client:
        avatar = client.create_avatar(avatar_bytes)
        job = client.wait(client.submit_job(avatar.id, one_second).id)
        assert job.state == gateway_pb2.JOB_STATE_SUCCEEDED, job.error
        assert [(m.name, m.backend, m.precision) for m in job.models] == [("wav2lip", "cpu", "fp32")]
        client.download(job.id, tmp_path / "out.mp4")
    info = probe_media(tmp_path / "out.mp4")
    assert (info["video_codec"], info["audio_codec"], info["frames"]) == ("h264", "aac", 25)
    assert "wav2lip" in w2l_cluster.processes["lipsync"].log()


def test_generate_equals_the_model_in_process(
    w2l_cluster: LocalCluster, checkpoint: Path, avatar_bytes: bytes, one_second: bytes
) -> None:
    # One real reference crop and four real mel windows (one with silence, three with speech).
    frames, _ = decode_avatar(avatar_bytes)
    (box,) = prepare_boxes(HaarFaceDetector().detect([frames[0]]), *frames.shape[1:3])
    assert box is not None
    crop = prep.crop_and_resize(frames[0], box)
    windows = MelExtractor().run(decode_audio(one_second, 16_000), 25.0)[[0, 5, 16, 20]]
    mels = [mel_to_bytes(w) for w in windows]
    paste = (box[2] - box[0], box[3] - box[1])

    def call(raw_size: bool) -> tuple[lipsync_pb2.GenerateResponse, ...]:
        requests = [
            lipsync_pb2.GenerateRequest(
                crops=[
                    lipsync_pb2.ReferenceCrop(
                        crop_index=3, image=image_to_proto(crop), paste_width=paste[0], paste_height=paste[1]
                    )
                ]
            ),
            lipsync_pb2.GenerateRequest(
                items=pack_generate_items(list(range(len(mels))), [3] * len(mels), mels), raw_size=raw_size
            ),
        ]
        with grpc.insecure_channel(w2l_cluster.processes["lipsync"].address) as channel:
            return tuple(lipsync_pb2_grpc.LipSyncServiceStub(channel).Generate(iter(requests), timeout=120))

    (raw,) = call(raw_size=True)
    assert raw.model.name == "wav2lip"
    got = np.stack(PackedImages.from_pb(raw.faces).arrays())
    assert list(raw.faces.frame_indices) == list(range(len(mels))) and list(raw.faces.crop_indices) == [3] * len(mels)

    model = load_wav2lip(checkpoint)
    with torch.no_grad():
        pred = model(
            torch.from_numpy(prep.mel_inputs(np.stack([mel_from_bytes(m) for m in mels]))),
            torch.from_numpy(prep.model_inputs(np.stack([crop] * len(mels)))),
        )
    expected = prep.to_uint8_faces(pred.numpy())
    assert got.shape == expected.shape == (len(mels), 96, 96, 3)
    diff = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    assert diff.max() <= 1, (diff.max(), (diff > 1).sum())
    assert (diff == 0).mean() > 0.99
    assert expected.min() > 0 and expected.max() < 255 and expected.std() > 20  # a meaningful comparison
    assert np.abs(got[0].astype(np.int16) - got[2]).mean() > 0.2, "the mel window had no effect"

    (pasted,) = call(raw_size=False)
    for image, exp in zip(PackedImages.from_pb(pasted.faces).arrays(), expected):
        assert image.shape == (paste[1], paste[0], 3)
        ref = prep.resize_to(exp, *paste)
        assert np.abs(image.astype(np.int16) - ref.astype(np.int16)).max() <= 1


def test_checkpoint_with_wrong_keys_fails_start(tmp_path: Path) -> None:
    weights = seeded_state_dict(Wav2Lip())
    weights.pop("output_block.1.weight")
    weights.pop("audio_encoder.0.conv_block.0.bias")
    weights["face_encoder_blocks.9.0.conv_block.0.weight"] = torch.zeros(3)
    bad = write_checkpoint(tmp_path / "bad.pth", {"module." + k: v for k, v in weights.items()})

    cluster = LocalCluster(tmp_path)
    try:
        cluster._start("lipsync", [f"--checkpoint={bad}", "--device=cpu"])
        with pytest.raises(RuntimeError) as err:
            cluster._wait_ready("lipsync")
    finally:
        cluster.stop()
    message = str(err.value)
    assert "lipsync exited with 1" in message
    for text in (
        "missing keys",
        "output_block.1.weight",
        "audio_encoder.0.conv_block.0.bias",
        "unexpected keys",
        "face_encoder_blocks.9.0.conv_block.0.weight",
        str(bad),
    ):
        assert text in message, text
    assert cluster.processes["lipsync"].process.returncode == 1
