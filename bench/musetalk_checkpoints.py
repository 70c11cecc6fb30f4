"""Seeded checkpoints of the musetalk tier in the public files' formats, for the benches: speed does
not depend on the values, and numbers (the live features' error) are taken on seeded networks.

`write_checkpoints(folder, tiny)` writes what the lipsync-musetalk stage loads (docs/architecture.md
section 3.1): `musetalkV15/unet.pth` (a plain state dict of diffusers' UNet2DConditionModel) with
`musetalkV15/musetalk.json`, the `sd-vae/` folder (diffusers' AutoencoderKL, save_pretrained), the
`whisper/` folder (transformers' WhisperForConditionalGeneration, save_pretrained); it returns the
stage's flags for them. The configs are the public files' own (the key tables recorded beside the
networks' tests, tests/unit/lipsync/musetalk/data/); `tiny` shrinks the UNet and the VAE (the same
block types, fewer and narrower) so a CPU runs them, and whisper's decoder (never loaded), leaving its
encoder whisper-tiny's (the stage's tokens are its 5 states x 384).
"""

from __future__ import annotations

import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TABLES = REPO_ROOT / "tests" / "unit" / "lipsync" / "musetalk" / "data"


def public_config(name: str) -> dict:
    """The config of a public checkpoint as its key table records it (unet, vae, whisper_encoder)."""
    return dict(json.loads((TABLES / f"keys_{name}.json").read_text())["config"])


def unet_config(tiny: bool) -> dict:
    config = public_config("unet")
    if tiny:
        config.update(block_out_channels=[32, 64, 64, 64], layers_per_block=1, norm_num_groups=32, attention_head_dim=2)
    return config


def vae_config(tiny: bool) -> dict:
    config = public_config("vae")
    if tiny:
        config.update(block_out_channels=[32, 32, 64, 64], layers_per_block=1, norm_num_groups=32)
    return config


def whisper_config(tiny: bool) -> dict:
    config = public_config("whisper_encoder")
    if tiny:  # the decoder is never loaded: keep it small
        config.update(decoder_layers=1, decoder_ffn_dim=64, vocab_size=128, max_target_positions=16)
        config.update(pad_token_id=50, bos_token_id=50, eos_token_id=50, decoder_start_token_id=51)
    return config


def write_whisper(folder: Path, tiny: bool = False, seed: int = 0) -> Path:
    """The HF whisper folder (config.json + model.safetensors), seeded."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(WhisperConfig(**{k: v for k, v in whisper_config(tiny).items()}))
    model.save_pretrained(folder)
    return folder


def write_checkpoints(folder: Path, tiny: bool = False, seed: int = 0) -> dict[str, str]:
    """Every generator checkpoint under `folder`, seeded; the stage's flags (name -> path)."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = unet_config(tiny)
    unet_dir = folder / "musetalkV15"
    unet_dir.mkdir(exist_ok=True)
    (unet_dir / "musetalk.json").write_text(json.dumps(config))
    unet = UNet2DConditionModel(**{k: v for k, v in config.items() if not k.startswith("_")})
    torch.save(unet.state_dict(), unet_dir / "unet.pth")
    del unet
    vae = AutoencoderKL(**{k: v for k, v in vae_config(tiny).items() if not k.startswith("_")})
    vae.save_pretrained(folder / "sd-vae", safe_serialization=False)  # diffusion_pytorch_model.bin, as public
    del vae
    write_whisper(folder / "whisper", tiny, seed)
    return {
        "unet": str(unet_dir / "unet.pth"),
        "unet_config": str(unet_dir / "musetalk.json"),
        "vae": str(folder / "sd-vae"),
        "whisper": str(folder / "whisper"),
    }
