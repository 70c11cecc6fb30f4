"""MuseTalk's VAE: diffusers' `AutoencoderKL` from the `sd-vae/` folder (stabilityai/sd-vae-ft-mse).

Upstream (`musetalk/models/vae.py`) loads the folder with `AutoencoderKL.from_pretrained`. That file was
written by diffusers 0.4.2, whose mid-block attention was named `query`, `key`, `value` and `proj_attn`;
today's diffusers calls them `to_q`, `to_k`, `to_v` and `to_out.0` and renames them at load. Here the
same renaming is done before a strict load, so a file that does not fit fails naming its keys (as every
lipline checkpoint does) instead of diffusers' warnings. diffusers is the reference implementation and
runs as it is (docs/decisions.md).

Scaling: the caller multiplies the encoder's mean by `VAE_SCALING_FACTOR` (MuseTalk: 0.18215, diffusers'
default, not in the folder's config.json) and divides the UNet's output by it before `decode`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from services.inference.checkpoints import clean_state_dict, load_strict, read_state_dict_file
from services.lipsync.musetalk.files import read_json_config, weights_in
from services.serving.errors import CheckpointError

if TYPE_CHECKING:  # at run time imported where the network is built (build_*)
    from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL

__all__ = ["VAE_SCALING_FACTOR", "VAE_WEIGHT_FILES", "MuseTalkVAE", "build_vae", "load_vae", "rename_legacy_attention"]

VAE_SCALING_FACTOR = 0.18215
# diffusers' file names, in its order of preference.
VAE_WEIGHT_FILES = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")

# diffusers < 0.14's attention block names -> today's (ModelMixin._convert_deprecated_attention_blocks).
_LEGACY_ATTENTION = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}
_LEGACY_KEY = re.compile(r"^(.*\.attentions\.\d+\.)(query|key|value|proj_attn)\.(weight|bias)$")


def rename_legacy_attention(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` with the legacy attention names (`...attentions.N.query.weight`) renamed to today's."""
    renamed: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        match = _LEGACY_KEY.match(key)
        if match is not None:
            key = f"{match.group(1)}{_LEGACY_ATTENTION[match.group(2)]}.{match.group(3)}"
        renamed[key] = value
    return renamed


class MuseTalkVAE(nn.Module):
    """The autoencoder with the two calls MuseTalk makes; calling the module decodes.

    The diffusers module is `self.vae` (state dict keys under the prefix `vae.`).
    """

    def __init__(self, vae: AutoencoderKL) -> None:
        super().__init__()
        self.vae = vae
        # diffusers' default (0.18215) where config.json does not say, as in sd-vae-ft-mse's.
        self.scaling_factor = float(vae.config["scaling_factor"])

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 3, H, W) RGB in [-1, 1] -> the latent distribution's (mean, logvar), each (B, 4, H/8, W/8).

        logvar is clamped to [-30, 20] as diffusers' DiagonalGaussianDistribution does. MuseTalk's
        avatar latents use the mean (deterministic; upstream inference samples, training used the mode).
        """
        posterior = self.vae.encode(x, return_dict=False)[0]
        return posterior.mean, posterior.logvar

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """(B, 4, h, w) latents (already divided by the scaling factor) -> (B, 3, 8h, 8w), raw: the
        caller maps it to pixels with `(x / 2 + 0.5).clamp(0, 1)`."""
        decoded: torch.Tensor = self.vae.decode(z, return_dict=False)[0]
        return decoded

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """`decode`: the per-frame half of the VAE, the one a serving stage compiles."""
        return self.decode(z)


def build_vae(config: Mapping[str, Any]) -> MuseTalkVAE:
    """The autoencoder for `config` (the folder's config.json) with diffusers' default initialisation."""
    # imported here, not with the module: diffusers takes seconds to import and the stand-in needs none of it
    from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL

    vae = AutoencoderKL.from_config(dict(config))
    assert isinstance(vae, AutoencoderKL)
    return MuseTalkVAE(vae)


def load_vae(folder: str | Path) -> MuseTalkVAE:
    """The VAE from a diffusers folder (`config.json` + `diffusion_pytorch_model.safetensors` or `.bin`),
    legacy attention names accepted, in eval mode.

    Raises:
        CheckpointError: a file missing or unreadable, or keys missing, unexpected or mis-shaped
            (named in the message; legacy names are reported as today's).
    """
    folder = Path(folder)
    config_file = folder / "config.json"
    config = read_json_config(config_file)
    weights = weights_in(folder, VAE_WEIGHT_FILES)
    try:
        with torch.device("meta"):  # the weights come from the file: nothing to initialise
            model = build_vae(config)
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"model config {config_file} does not describe an AutoencoderKL: {exc}") from exc
    state_dict = rename_legacy_attention(clean_state_dict(read_state_dict_file(weights)))
    load_strict(model.vae, state_dict, source=str(weights), assign=True)
    return model.eval()
