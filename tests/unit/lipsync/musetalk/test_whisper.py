"""services/lipsync/musetalk/whisper.py: the encoder against transformers', and upstream's token windows.

data/keys_whisper_encoder.json is the key table of whisper-tiny's encoder (`WhisperModel(config).encoder`,
transformers 4.39.2; in the public file each key carries `model.encoder.`). The numerical check writes
a small `WhisperForConditionalGeneration` with `save_pretrained` (the HF folder upstream downloads,
decoder included) and compares `load_whisper_encoder` with transformers' encoder as MuseTalk calls it
(`WhisperModel.from_pretrained(folder).encoder(x, output_hidden_states=True).hidden_states`, stacked).
The chunking is checked on hand-computed windows and against upstream's loop written out here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from services.lipsync.musetalk import load_whisper_encoder, positional_encoding, whisper_chunks
from services.lipsync.musetalk.whisper import WhisperEncoder, WhisperEncoderConfig, feature_length, window_starts
from services.serving.errors import CheckpointError

TABLE = json.loads((Path(__file__).parent / "data" / "keys_whisper_encoder.json").read_text())
SMALL = {
    **TABLE["config"],
    "d_model": 64,
    "encoder_layers": 3,
    "encoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "max_source_positions": 100,
    "decoder_layers": 1,
    "decoder_attention_heads": 4,
    "decoder_ffn_dim": 128,
    "vocab_size": 120,
    "max_target_positions": 16,
    "pad_token_id": 50,
    "bos_token_id": 50,
    "eos_token_id": 50,
    "decoder_start_token_id": 51,
}


def _hf_folder(folder: Path, safe_serialization: bool = False) -> Path:
    """A seeded whisper checkpoint saved as transformers saves one (config.json + the weights)."""
    # imported here, not with the module: it takes seconds, paid only by the worker that runs this test
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(WhisperConfig(**SMALL))
    with torch.no_grad():  # LayerNorms and biases away from their 1/0 initialisation, so they are tested
        for name, param in model.named_parameters():
            if "layer_norm" in name or name.endswith(".bias"):
                param.add_(torch.randn_like(param) * 0.3)
    model.save_pretrained(folder)  # config.json + model.safetensors
    if not safe_serialization:  # the public whisper-tiny folder's pickle, written as transformers 4 wrote it
        (folder / "model.safetensors").unlink()
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _hf_folder(tmp_path_factory.mktemp("whisper"))


def test_the_full_size_encoder_has_the_public_checkpoints_keys() -> None:
    with torch.device("meta"):
        model = WhisperEncoder(WhisperEncoderConfig.from_hf(TABLE["config"]))
    assert model.config == WhisperEncoderConfig()  # whisper-tiny's are the defaults
    keys = [[k, list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in model.state_dict().items()]
    assert keys == TABLE["keys"]
    assert sum(v.numel() for v in model.state_dict().values()) == TABLE["summary"]["num_elements"]
    assert TABLE["file_prefix"] == "model.encoder."


def _transformers_states(folder: Path, features: torch.Tensor) -> torch.Tensor:
    """MuseTalk's call (musetalk/utils/audio_processor.py): all hidden states, stacked on dim 2."""
    # imported here, not with the module: it takes seconds, paid only by the worker that runs this test
    from transformers import WhisperModel

    whisper = WhisperModel.from_pretrained(folder).eval()
    with torch.no_grad():
        states = whisper.encoder(features, output_hidden_states=True).hidden_states
    assert len(states) == SMALL["encoder_layers"] + 1
    return torch.stack(states, dim=2)


@pytest.mark.parametrize("safe_serialization", [False, True], ids=["pytorch_model.bin", "model.safetensors"])
def test_the_encoder_equals_transformers(safe_serialization: bool, tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "whisper", safe_serialization)
    weights = "model.safetensors" if safe_serialization else "pytorch_model.bin"
    assert (folder / weights).is_file()
    model = load_whisper_encoder(folder)
    assert not model.training
    features = torch.randn(2, 80, 200, generator=torch.Generator().manual_seed(3))
    expected = _transformers_states(folder, features)
    with torch.no_grad():
        got = model(features)
    assert got.shape == expected.shape == (2, 100, 4, 64)
    assert (got - expected).norm() / expected.norm() < 1e-4
    # The last state is after the final LayerNorm, the others are not normalised by it.
    assert (got[:, :, -1] - expected[:, :, -1]).norm() / expected[:, :, -1].norm() < 1e-4


def test_the_input_must_be_a_window_the_positions_cover(folder: Path) -> None:
    model = load_whisper_encoder(folder)
    for frames in (201, 202):
        with pytest.raises(ValueError, match="even number of mel frames up to 200"):
            model(torch.zeros(1, 80, frames))
    assert model(torch.zeros(1, 80, 60)).shape == (1, 30, 4, 64)  # a shorter window, deliberately


def test_decoder_keys_are_ignored_and_anything_else_fails_naming_it(folder: Path, tmp_path: Path) -> None:
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    assert any(k.startswith("model.decoder.") for k in state)  # they are there, and load_whisper_encoder ran

    def write(name: str, weights: dict[str, torch.Tensor]) -> Path:
        target = tmp_path / name
        target.mkdir()
        (target / "config.json").write_text((folder / "config.json").read_text())
        torch.save(weights, target / "pytorch_model.bin")
        return target

    with pytest.raises(CheckpointError, match=r"unexpected keys: model\.adapter\.weight"):
        load_whisper_encoder(write("stray", {**state, "model.adapter.weight": torch.zeros(1)}))
    missing = {k: v for k, v in state.items() if k != "model.encoder.layers.1.self_attn.k_proj.weight"}
    with pytest.raises(CheckpointError, match=r"missing keys: layers\.1\.self_attn\.k_proj\.weight"):
        load_whisper_encoder(write("missing", missing))
    extra = {**state, "model.encoder.layers.9.fc1.weight": torch.zeros(1)}
    with pytest.raises(CheckpointError, match=r"unexpected keys: layers\.9\.fc1\.weight"):
        load_whisper_encoder(write("extra", extra))
    with pytest.raises(CheckpointError, match="no whisper encoder keys"):
        load_whisper_encoder(write("decoder-only", {k: v for k, v in state.items() if "encoder" not in k}))
    with pytest.raises(CheckpointError, match="none of the weight files"):
        (tmp_path / "extra" / "pytorch_model.bin").unlink()
        load_whisper_encoder(tmp_path / "extra")


# ---- the token windows ----


def _states(length: int, states: int = 5, width: int = 3) -> torch.Tensor:
    """hidden[t, s, :] = 100 (t + 1) + s: each value says which position and state it came from."""
    t = torch.arange(length, dtype=torch.float32)[:, None, None]
    s = torch.arange(states, dtype=torch.float32)[None, :, None]
    return (100 * (t + 1) + s).expand(length, states, width).clone()


def _positions(chunk: torch.Tensor, states: int = 5) -> list[int | None]:
    """Which clip position each of a frame's ten windows came from (None: padding)."""
    out: list[int | None] = []
    for t in range(10):
        block = chunk[t * states : (t + 1) * states, 0]
        if (block == 0).all():
            out.append(None)
        else:
            assert torch.equal(block, block[0] + torch.arange(states, dtype=block.dtype))  # time-major: 5 states
            out.append(int(block[0].item()) // 100 - 1)
    return out


def test_25_fps_frame_i_hears_positions_2i_minus_4_to_2i_plus_6() -> None:
    hidden = _states(12)  # 0.24 s of audio
    chunks = whisper_chunks(hidden, 6, 25)
    assert chunks.shape == (6, 50, 3)
    _ = None
    assert _positions(chunks[0]) == [_, _, _, _, 0, 1, 2, 3, 4, 5]
    assert _positions(chunks[1]) == [_, _, 0, 1, 2, 3, 4, 5, 6, 7]
    assert _positions(chunks[2]) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert _positions(chunks[3]) == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert _positions(chunks[5]) == [6, 7, 8, 9, 10, 11, _, _, _, _]


def test_other_rates_step_by_50_over_fps_with_upstreams_padding() -> None:
    hidden = _states(20)
    _ = None
    # 30 fps: step 5/3, ceil(5/3) = 2 -> 4 positions of padding in front; starts 0, 1, 3, 5 (3 * 5/3 rounds to 5).
    assert list(window_starts(5, 30)) == [0, 1, 3, 5, 6]
    chunks = whisper_chunks(hidden, 5, 30)
    assert _positions(chunks[3]) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    # 20 fps: step 2.5, ceil = 3 -> 6 positions in front; starts 0, 2, 5, 7.
    chunks = whisper_chunks(hidden, 4, 20)
    assert _positions(chunks[0]) == [_, _, _, _, _, _, 0, 1, 2, 3]
    assert _positions(chunks[3]) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    # 29.97 fps uses its own step (upstream would truncate to 29 and drift 3 %).
    assert window_starts(1801, 29.97)[-1] == math.floor(1800 * (50 / 29.97)) == 3003


def _upstream_chunks(hidden: torch.Tensor, num_samples: int, fps: int) -> torch.Tensor:
    """musetalk/utils/audio_processor.py `get_whisper_chunk` from the stacked states on, written out;
    where upstream stops with an error (a window past its padding), the frames before it."""
    whisper_feature = hidden[None]
    multiplier = 50 / fps
    num_frames = math.floor((num_samples / 16000) * fps)
    whisper_feature = whisper_feature[:, : math.floor((num_samples / 16000) * 50), ...]
    padding = math.ceil(multiplier)
    whisper_feature = torch.cat(
        [
            torch.zeros_like(whisper_feature[:, : padding * 2]),
            whisper_feature,
            torch.zeros_like(whisper_feature[:, : padding * 3 * 2]),
        ],
        1,
    )
    prompts = []
    for frame_index in range(num_frames):
        index = math.floor(frame_index * multiplier)
        clip = whisper_feature[:, index : index + 10]
        if clip.shape[1] != 10:  # upstream: `assert`, caught, printed, exit()
            break
        prompts.append(clip)
    stacked = torch.cat(prompts, dim=0)  # (T, 10, 5, 384) -> rearrange 'b c h w -> b (c h) w'
    return stacked.reshape(stacked.shape[0], stacked.shape[1] * stacked.shape[2], stacked.shape[3])


@pytest.mark.parametrize("fps", [25, 30, 24, 20, 12, 50, 60])
@pytest.mark.parametrize("seconds", [0.52, 3.0, 7.013])
def test_whisper_chunks_is_upstreams_rule(fps: int, seconds: float) -> None:
    num_samples = round(seconds * 16000)
    encoded = torch.randn(1500, 5, 8, generator=torch.Generator().manual_seed(fps))  # one 30 s window's states
    expected = _upstream_chunks(encoded, num_samples, fps)
    n_frames = math.floor((num_samples / 16000) * fps)
    got = whisper_chunks(encoded[: feature_length(num_samples)], n_frames, fps)
    assert got.shape == (n_frames, 50, 8)
    assert torch.equal(got[: len(expected)], expected)
    # Upstream covers every frame below 50 fps; at 50 and 60 fps its last window overruns its padding
    # (ceil(50 / fps) = 1: 2 + 6 positions) and it stops, where the zeros continue here.
    assert len(expected) == (n_frames if fps < 50 else n_frames - 1)


def test_frames_past_the_padding_read_zeros_and_dtype_and_device_are_kept() -> None:
    hidden = _states(4).half()
    chunks = whisper_chunks(hidden, 10, 25)
    assert chunks.dtype == torch.float16 and chunks.shape == (10, 50, 3)
    _ = None
    assert _positions(chunks[2].float()) == [0, 1, 2, 3, _, _, _, _, _, _]
    # Frame 9 reads up to padded position 28, past upstream's 4 + 4 + 12: zeros, where upstream stops.
    assert (chunks[4:] == 0).all()
    assert whisper_chunks(hidden, 0, 25).shape == (0, 50, 3)
    assert feature_length(16000) == 50 and feature_length(16319) == 50 and feature_length(16320) == 51


def test_positional_encoding_is_musetalks_sinusoid() -> None:
    tokens = torch.zeros(2, 50, 384)
    pe = positional_encoding(tokens)[0].double()
    position = np.arange(50)[:, None]
    frequency = np.exp(np.arange(0, 384, 2) * (-math.log(10000.0) / 384))
    np.testing.assert_allclose(pe[:, 0::2].numpy(), np.sin(position * frequency), atol=2e-5)
    np.testing.assert_allclose(pe[:, 1::2].numpy(), np.cos(position * frequency), atol=2e-5)
    assert pe[0, 0] == 0 and pe[0, 1] == 1 and abs(pe[1, 0] - math.sin(1)) < 1e-6 and abs(pe[1, 1] - math.cos(1)) < 1e-6
    # Added, not replaced; in half precision the table is cast first (upstream's pe.half()).
    ones = torch.ones(1, 50, 384)
    assert torch.equal(positional_encoding(ones), ones + positional_encoding(torch.zeros(1, 50, 384)))
    half = torch.randn(3, 50, 384).half()
    assert torch.equal(positional_encoding(half), half + positional_encoding(torch.zeros(1, 50, 384)).half())
