"""services/lipsync/musetalk/vae.py: the sd-vae folder's keys (legacy names too), and the VAE as upstream
loads and runs it.

data/keys_vae.json is the key table of stabilityai/sd-vae-ft-mse (`AutoencoderKL(**config.json)`,
diffusers 0.30.2) with `legacy_names`, the mid-block attention names of the public file (written by
diffusers 0.4.2). The numerical check writes a small AutoencoderKL of the same classes as that folder is
written (config.json + diffusion_pytorch_model.bin with the legacy names) and compares `load_vae` with
upstream's loader, `AutoencoderKL.from_pretrained`, which does its own renaming.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from services.inference.checkpoints import seeded_state_dict
from services.lipsync.musetalk import VAE_SCALING_FACTOR, load_vae
from services.lipsync.musetalk.vae import build_vae, rename_legacy_attention
from services.serving.errors import CheckpointError

TABLE = json.loads((Path(__file__).parent / "data" / "keys_vae.json").read_text())
SMALL: dict[str, Any] = {
    **TABLE["config"],
    "block_out_channels": [32, 64],
    "down_block_types": ["DownEncoderBlock2D"] * 2,
    "up_block_types": ["UpDecoderBlock2D"] * 2,
    "layers_per_block": 1,
    "sample_size": 64,
}
LEGACY = {new: old for new, old in TABLE["legacy_names"].items()}


def _legacy(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` under the names diffusers 0.4.2 wrote (the public file's)."""
    return {LEGACY.get(k, k): v for k, v in state_dict.items()}


def _write(folder: Path, state_dict: dict[str, torch.Tensor], safetensors: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(SMALL, indent=2))
    if safetensors:
        save_file(
            {k: v.contiguous() for k, v in state_dict.items()}, str(folder / "diffusion_pytorch_model.safetensors")
        )
    else:
        torch.save(state_dict, folder / "diffusion_pytorch_model.bin")
    return folder


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    """Seeded weights with GroupNorm scales near 1 (a 0.02 scale would shrink every block to nothing)."""
    weights = seeded_state_dict(build_vae(SMALL).vae, scale=0.05)
    for key in weights:
        if "norm" in key and key.endswith(".weight"):
            weights[key] = weights[key] + 1
    return weights


def test_the_full_size_vae_has_the_public_checkpoints_keys() -> None:
    with torch.device("meta"):
        model = build_vae(TABLE["config"])
    keys = [[k, list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in model.vae.state_dict().items()]
    assert keys == TABLE["keys"]
    assert sum(v.numel() for v in model.vae.state_dict().values()) == TABLE["summary"]["num_elements"]
    assert model.scaling_factor == VAE_SCALING_FACTOR == TABLE["scaling_factor"] == 0.18215
    # The public file's legacy names map onto exactly these keys.
    legacy = {LEGACY.get(k, k): torch.empty(0) for k, _, _ in TABLE["keys"]}
    assert len(LEGACY) == 16 and list(rename_legacy_attention(legacy)) == [k for k, _, _ in TABLE["keys"]]


@pytest.mark.parametrize("layout", ["bin with legacy names", "safetensors with today's names"])
def test_load_vae_runs_upstreams_vae(layout: str, tmp_path: Path, weights: dict[str, torch.Tensor]) -> None:
    if layout.startswith("bin"):
        folder = _write(tmp_path / "sd-vae", _legacy(weights))
        assert any(
            k.endswith("mid_block.attentions.0.query.weight")
            for k in torch.load(folder / "diffusion_pytorch_model.bin")
        )
    else:
        folder = _write(tmp_path / "sd-vae", weights, safetensors=True)
    model = load_vae(folder)
    assert not model.training
    # imported here, not with the module: it takes seconds, paid only by the worker that runs this test
    from diffusers import AutoencoderKL

    reference = AutoencoderKL.from_pretrained(folder, low_cpu_mem_usage=False).eval()

    gen = torch.Generator().manual_seed(2)
    x = torch.rand(2, 3, 64, 64, generator=gen) * 2 - 1
    z = torch.randn(2, 4, 32, 32, generator=gen)
    with torch.no_grad():
        posterior = reference.encode(x).latent_dist
        mean, logvar = model.encode(x)
        decoded = model.decode(z)
        expected = reference.decode(z).sample
    assert mean.shape == logvar.shape == (2, 4, 32, 32) and decoded.shape == (2, 3, 64, 64)  # two blocks: x2
    for got, want in ((mean, posterior.mean), (logvar, posterior.logvar), (decoded, expected)):
        assert (got - want).norm() / want.norm() < 1e-4
    assert torch.equal(model(z), decoded)  # calling the module decodes
    # The weights were read: the default initialisation decodes differently.
    with torch.no_grad():
        fresh = build_vae(SMALL).eval().decode(z)
    assert (fresh - expected).norm() / expected.norm() > 0.1


def test_logvar_is_clamped_as_upstream(tmp_path: Path, weights: dict[str, torch.Tensor]) -> None:
    """diffusers' DiagonalGaussianDistribution clamps logvar to [-30, 20]: push channels past both ends."""
    bias = weights["quant_conv.bias"].clone()
    bias[4:6], bias[6:8] = 60.0, -60.0  # channels 4-7 are the logvar half
    model = load_vae(_write(tmp_path / "sd-vae", {**weights, "quant_conv.bias": bias}))
    with torch.no_grad():
        mean, logvar = model.encode(torch.zeros(1, 3, 64, 64))
    assert (logvar[:, :2] == 20).all() and (logvar[:, 2:] == -30).all()
    assert mean.abs().max() < 20


def test_a_checkpoint_with_a_missing_or_an_extra_key_fails_naming_it(
    tmp_path: Path, weights: dict[str, torch.Tensor]
) -> None:
    legacy = _legacy(weights)
    missing = dict(legacy)
    del missing["decoder.mid_block.attentions.0.proj_attn.weight"]
    with pytest.raises(CheckpointError, match=r"missing keys: decoder\.mid_block\.attentions\.0\.to_out\.0\.weight"):
        load_vae(_write(tmp_path / "missing", missing))
    extra = {**legacy, "encoder.extra.weight": torch.zeros(1)}
    with pytest.raises(CheckpointError, match=r"unexpected keys: encoder\.extra\.weight"):
        load_vae(_write(tmp_path / "extra", extra))
    with pytest.raises(CheckpointError, match="none of the weight files"):
        (tmp_path / "extra" / "diffusion_pytorch_model.bin").unlink()
        load_vae(tmp_path / "extra")
    with pytest.raises(CheckpointError, match="config.json does not exist"):
        load_vae(tmp_path / "nowhere")
