"""The lipsync-musetalk stage on the MuseTalk networks (small seeded ones written in the public file
formats; full-size whisper-tiny) through gRPC on 127.0.0.1: Generate's faces equal, to the uint8, an
independent run of upstream's steps with the networks' own functions (the encoder over each 30 s
window, the states concatenated and cut, `whisper_chunks`, `positional_encoding`, the UNet at t = 0,
/ 0.18215, the VAE decode, (x / 2 + 0.5).clamp(0, 1), x 255 rounded, RGB to BGR), for frames on both
sides of a window boundary; PrepareAvatar's latents are the VAE means of the Lanczos crop.

The networks are services/lipsync/musetalk/{unet,vae,whisper}.py (their own branch): skipped without them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from lipline.v1 import lipsync_pb2
from services.media.musetalk_wire import pack_items, pack_latents, pack_window
from services.media.whisper_windows import clip_positions, frame_window, window_positions
from services.media.wire import image_to_proto
from tests.helpers.musetalk_stage import RunningStage
from tests.integration.util import SAMPLES

unet_module = pytest.importorskip("services.lipsync.musetalk.unet", reason="the MuseTalk networks (musetalk-nets)")
vae_module = pytest.importorskip("services.lipsync.musetalk.vae")
whisper_module = pytest.importorskip("services.lipsync.musetalk.whisper")
mel_module = pytest.importorskip("services.media.whisper_mel")

pytestmark = pytest.mark.slow
DATA = Path(__file__).parent / "data"  # the networks' key tables (musetalk-nets' tests)
FRAMES = [0, 1, 50, 373, 374, 375, 376, 700, 860]  # 374-375: the first 30 s window ends at position 1500


def _seeded(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    weights = {}
    for key, value in module.state_dict().items():
        if value.is_floating_point():
            value = torch.randn_like(value) * 0.05 + (1.0 if "norm" in key and key.endswith(".weight") else 0.0)
        weights[key] = value
    return weights


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    small = {"block_out_channels": [32, 32, 64, 64], "layers_per_block": 1}
    unet_config = {**json.loads((DATA / "keys_unet.json").read_text())["config"], **small, "sample_size": 16}
    (root / "musetalkV15").mkdir()
    torch.save(_seeded(unet_module.build_unet(unet_config).unet), root / "musetalkV15" / "unet.pth")
    (root / "musetalkV15" / "musetalk.json").write_text(json.dumps(unet_config))
    vae_config = {**json.loads((DATA / "keys_vae.json").read_text())["config"], **small}
    (root / "sd-vae").mkdir()
    (root / "sd-vae" / "config.json").write_text(json.dumps(vae_config))
    torch.save(_seeded(vae_module.build_vae(vae_config).vae), root / "sd-vae" / "diffusion_pytorch_model.bin")
    encoder = whisper_module.WhisperEncoder(whisper_module.WhisperEncoderConfig())  # whisper-tiny's size
    (root / "whisper").mkdir()
    (root / "whisper" / "config.json").write_text("{}")  # transformers' defaults: whisper-tiny
    torch.save({f"model.encoder.{k}": v for k, v in _seeded(encoder).items()}, root / "whisper" / "pytorch_model.bin")
    return root


@pytest.fixture(scope="module")
def stage(models: Path) -> Iterator[RunningStage]:
    paths = {
        "unet": str(models / "musetalkV15" / "unet.pth"),
        "unet_config": str(models / "musetalkV15" / "musetalk.json"),
        "vae": str(models / "sd-vae"),
        "whisper": str(models / "whisper"),
    }
    with RunningStage(**paths) as running:
        yield running


def test_generate_is_upstreams_steps_to_the_uint8(stage: RunningStage, models: Path) -> None:
    import librosa

    photo = cv2.imread(str(SAMPLES / "avatar.jpg"))
    (prepared,) = stage.stub.PrepareAvatar(
        iter(
            [lipsync_pb2.PrepareAvatarRequest(frames=[lipsync_pb2.IndexedFrame(index=0, image=image_to_proto(photo))])]
        ),
        timeout=300,
    )
    assert prepared.model.name.endswith("+sd-vae+ellipse")
    frame = prepared.frames[0]
    latents = np.frombuffer(frame.latents, "<f2").reshape(1, 8, 32, 32)
    vae = vae_module.load_vae(models / "sd-vae")
    b = frame.box
    crop = cv2.resize(photo[b.y1 : b.y2, b.x1 : b.x2], (256, 256), interpolation=cv2.INTER_LANCZOS4)
    x = torch.from_numpy(crop[:, :, ::-1].copy()).permute(2, 0, 1)[None].float() / 127.5 - 1.0
    masked = x.clone()
    masked[:, :, 128:] = -1.0
    with torch.no_grad():
        expected = torch.cat([vae.encode(masked)[0], vae.encode(x)[0]], 1) * 0.18215
    np.testing.assert_allclose(latents.astype(np.float32), expected.numpy(), atol=2e-3, rtol=2e-3)

    speech, _ = librosa.load(str(SAMPLES / "speech.wav"), sr=16000)
    audio = np.tile(speech, 5)[: 35 * 16000]  # two 30 s windows
    positions = clip_positions(len(audio))
    mels = [mel_module.whisper_log_mel(audio[k * 480_000 : (k + 1) * 480_000]) for k in range(2)]
    windows = [pack_window(k, mels[k], float(mels[k][0, -1]), window_positions(k, positions), k > 0) for k in range(2)]
    window_of, offsets = zip(*(frame_window(i, 25) for i in FRAMES))
    request = lipsync_pb2.MuseTalkGenerateRequest(
        latents=pack_latents([0], latents),
        windows=windows,
        items=pack_items(FRAMES, [0] * len(FRAMES), window_of, offsets),
    )
    frames, faces, model = stage.generate([request])
    assert frames == FRAMES and model == "musetalk"

    encoder = whisper_module.load_whisper_encoder(models / "whisper")
    unet = unet_module.load_unet(models / "musetalkV15" / "unet.pth")
    with torch.no_grad():  # the log-mel as the wire carries it (float16)
        states = [encoder(torch.from_numpy(m.astype(np.float16).astype(np.float32))[None])[0] for m in mels]
        hidden = torch.cat(states)[:positions]
        tokens = whisper_module.whisper_chunks(hidden, max(FRAMES) + 1, 25)[FRAMES]
        sample = torch.from_numpy(latents.astype(np.float32)).repeat(len(FRAMES), 1, 1, 1)
        predicted = unet(sample, torch.zeros(len(FRAMES), dtype=torch.long), whisper_module.positional_encoding(tokens))
        image = (vae.decode(predicted / 0.18215) / 2 + 0.5).clamp(0, 1)
    reference = (image * 255).round().to(torch.uint8).flip(1).permute(0, 2, 3, 1).numpy()
    assert np.abs(reference.astype(int) - faces.astype(int)).max() <= 1
    assert np.abs(faces[0].astype(int) - faces[3].astype(int)).mean() > 0.5  # the audio changes the face
