"""Seeded MuseTalk 1.5 checkpoints written in the public layout, for benchmarks and tests (speed does
not depend on the weights; `services.inference.checkpoints.seeded_state_dict` draws them).

`write_seeded_networks(folder)` writes what the stage's settings `unet`, `unet_config`, `vae` and
`whisper` name, as upstream's files are (docs/architecture.md section 3.1):

- `musetalkV15/unet.pth` (a plain state dict, diffusers names) and `musetalkV15/musetalk.json`;
- `sd-vae/config.json` + `diffusion_pytorch_model.bin` with the mid-block attention's legacy names
  (`query/key/value/proj_attn`, as the public file written by diffusers 0.4.2);
- `whisper/config.json` + `pytorch_model.bin` with the encoder's keys under `model.encoder.` (the
  decoder's keys, which the loader ignores, are left out).

`small=True` gives the same classes with few channels (each network a few MB; the VAE keeps its four
levels, so its decoder still upsamples 8x) for CPU tests. The full size is 3.4 GB of fp32 UNet: the
networks are built on the meta device, so only the drawn tensors take memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from services.inference.checkpoints import seeded_state_dict
from services.lipsync.musetalk.unet import UNET_CONFIG_NAME, build_unet
from services.lipsync.musetalk.vae import build_vae
from services.lipsync.musetalk.whisper import WhisperEncoder, WhisperEncoderConfig

__all__ = [
    "UNET_CONFIG",
    "VAE_CONFIG",
    "WHISPER_CONFIG",
    "configs",
    "given_or_seeded_networks",
    "network_paths",
    "write_seeded_networks",
    "write_seeded_whisper",
]

# musetalkV15/musetalk.json
UNET_CONFIG: dict[str, Any] = {
    "_class_name": "UNet2DConditionModel",
    "act_fn": "silu",
    "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False,
    "cross_attention_dim": 384,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 8,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "out_channels": 4,
    "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
}
# stabilityai/sd-vae-ft-mse's config.json
VAE_CONFIG: dict[str, Any] = {
    "_class_name": "AutoencoderKL",
    "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "in_channels": 3,
    "latent_channels": 4,
    "layers_per_block": 2,
    "norm_num_groups": 32,
    "out_channels": 3,
    "sample_size": 256,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
}
# openai/whisper-tiny's config.json (the encoder's fields; the loader reads only these)
WHISPER_CONFIG: dict[str, Any] = {
    "model_type": "whisper",
    "activation_function": "gelu",
    "d_model": 384,
    "encoder_attention_heads": 6,
    "encoder_ffn_dim": 1536,
    "encoder_layers": 4,
    "max_source_positions": 1500,
    "num_mel_bins": 80,
}
_SMALL: dict[str, dict[str, Any]] = {
    "unet": {"block_out_channels": [32, 32, 64, 64], "layers_per_block": 1},
    "vae": {"block_out_channels": [32, 32, 32, 32], "layers_per_block": 1},
    "whisper": {"encoder_ffn_dim": 256},  # width 384 and 4 layers: the tokens are 5 x 384 per position
}
# diffusers' names of the VAE mid-block attention -> the public file's (diffusers 0.4.2)
_LEGACY = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}


def configs(small: bool = False) -> dict[str, dict[str, Any]]:
    """The three networks' configs (full size, or the small CPU variant)."""
    out = {"unet": dict(UNET_CONFIG), "vae": dict(VAE_CONFIG), "whisper": dict(WHISPER_CONFIG)}
    if small:
        for name, change in _SMALL.items():
            out[name].update(change)
    return out


def _legacy_names(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state_dict.items():
        if ".attentions." in key:
            for new, old in _LEGACY.items():
                key = key.replace(f".{new}.", f".{old}.")
        out[key] = value
    return out


def _variance_preserving(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The seeded draws rescaled so activations keep their size through the network, as a trained
    network's do: normalisation scales near 1 (at 0.05 every block would shrink to nothing) and each
    convolution's or projection's weights at std 1 / sqrt(fan-in). A fixed 0.05 grows the full-size UNet's
    and VAE decoder's activations by ~3x per convolution, past fp16's range (inf, then NaN), which a GPU
    benchmark in fp16 must not meet: the speed is the same, the numbers stay finite."""
    out = {}
    for key, value in weights.items():
        if "norm" in key and key.endswith(".weight") and value.ndim == 1:
            value = value + 1
        elif key.endswith(".weight") and value.ndim >= 2:
            fan_in = value[0].numel()
            value = value / 0.05 / fan_in**0.5
        out[key] = value
    return out


def write_seeded_networks(folder: str | Path, small: bool = False) -> dict[str, str]:
    """Write the three networks' seeded files under `folder`; returns the stage's settings naming them."""
    folder = Path(folder)
    cfg = configs(small)
    (folder / "musetalkV15").mkdir(parents=True, exist_ok=True)
    (folder / "sd-vae").mkdir(exist_ok=True)
    with torch.device("meta"):  # shapes only: seeded_state_dict draws every tensor on the CPU
        unet = build_unet(cfg["unet"]).unet
        vae = build_vae(cfg["vae"]).vae
        encoder = WhisperEncoder(WhisperEncoderConfig.from_hf(cfg["whisper"]))
    unet_path = folder / "musetalkV15" / "unet.pth"
    torch.save(_variance_preserving(seeded_state_dict(unet, scale=0.05)), unet_path)
    del unet
    (folder / "musetalkV15" / UNET_CONFIG_NAME).write_text(json.dumps(cfg["unet"], indent=2))
    weights = _variance_preserving(seeded_state_dict(vae, scale=0.05))
    torch.save(_legacy_names(weights), folder / "sd-vae" / "diffusion_pytorch_model.bin")
    (folder / "sd-vae" / "config.json").write_text(json.dumps(cfg["vae"], indent=2))
    _write_whisper(encoder, cfg["whisper"], folder / "whisper")
    return network_paths(folder)


def given_or_seeded_networks(given: str, folder: str | Path, small: bool = False) -> dict[str, str]:
    """The benches' choice: the networks of the models folder `given` (public layout), else seeded
    ones written under `folder`."""
    return network_paths(given) if given else write_seeded_networks(folder, small)


def network_paths(folder: str | Path) -> dict[str, str]:
    """The stage's settings naming the networks of a models folder in the public layout (what
    write_seeded_networks writes and fetch_models downloads), so a bench can reuse a folder."""
    folder = Path(folder)
    return {
        "unet": str(folder / "musetalkV15" / "unet.pth"),
        "unet_config": str(folder / "musetalkV15" / UNET_CONFIG_NAME),
        "vae": str(folder / "sd-vae"),
        "whisper": str(folder / "whisper"),
    }


def write_seeded_whisper(folder: str | Path, small: bool = False) -> Path:
    """Only the whisper encoder's seeded folder (what the setting `whisper` names): for measuring the
    features alone (bench/musetalk_live_features.py). Returns `folder`."""
    config = configs(small)["whisper"]
    with torch.device("meta"):
        encoder = WhisperEncoder(WhisperEncoderConfig.from_hf(config))
    return _write_whisper(encoder, config, Path(folder))


def _write_whisper(encoder: WhisperEncoder, config: dict[str, Any], folder: Path) -> Path:
    """config.json + pytorch_model.bin, the encoder's keys under `model.encoder.` as in the HF file."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = seeded_state_dict(encoder, scale=0.05)
    for key in weights:
        if "layer_norm" in key and key.endswith(".weight"):
            weights[key] = weights[key] + 1
    torch.save({f"model.encoder.{k}": v for k, v in weights.items()}, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
