"""MuseTalk's UNet: diffusers' `UNet2DConditionModel` built from `musetalk.json`, weights from `unet.pth`.

Upstream (`musetalk/models/unet.py`) builds `UNet2DConditionModel(**musetalk.json)` and loads the plain
state dict strictly: the SD-1.x layout with 8 input channels (the masked face's latent and the
reference's), 4 outputs, cross-attention over 50 whisper tokens of width 384, run once at timestep 0.
diffusers is the reference implementation and runs here as it is (docs/decisions.md); this module only
reads the files, fails naming the keys that do not fit, and gives the network a plain tensor-in,
tensor-out call.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from services.inference.checkpoints import clean_state_dict, load_strict, read_state_dict_file
from services.lipsync.musetalk.files import read_json_config
from services.serving.errors import CheckpointError

if TYPE_CHECKING:  # at run time imported where the network is built (build_*)
    from diffusers.models.unets.unet_2d_condition import UNet2DConditionModel

__all__ = ["UNET_CONFIG_NAME", "MuseTalkUNet", "build_unet", "load_unet"]

# The config file beside the weights (models/musetalkV15/musetalk.json upstream).
UNET_CONFIG_NAME = "musetalk.json"


class MuseTalkUNet(nn.Module):
    """The UNet called as upstream calls it, returning the predicted latent as a tensor.

    The diffusers module is `self.unet`, so this module's state dict carries the checkpoint's keys
    under the prefix `unet.`.
    """

    def __init__(self, unet: UNet2DConditionModel) -> None:
        super().__init__()
        self.unet = unet

    def forward(
        self, sample: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor
    ) -> torch.Tensor:
        """(B, 8, 32, 32) latents [masked | reference], (B,) or (1,) timesteps (MuseTalk: 0), (B, 50, 384)
        audio tokens with the positional encoding added -> (B, 4, 32, 32) predicted latent (scaled by
        the VAE's factor, as the VAE's encoder output times 0.18215)."""
        predicted: torch.Tensor = self.unet(
            sample, timestep, encoder_hidden_states=encoder_hidden_states, return_dict=False
        )[0]
        return predicted


def build_unet(config: Mapping[str, Any]) -> MuseTalkUNet:
    """The network for `config` (musetalk.json's content) with diffusers' default initialisation."""
    # imported here, not with the module: diffusers takes seconds to import and the stand-in needs none of it
    from diffusers.models.unets.unet_2d_condition import UNet2DConditionModel

    # from_config, not `UNet2DConditionModel(**config)`: the same constructor, but it drops the file's
    # bookkeeping entries (`_class_name`, `_diffusers_version`) and tolerates unknown ones.
    unet = UNet2DConditionModel.from_config(dict(config))
    assert isinstance(unet, UNet2DConditionModel)
    return MuseTalkUNet(unet)


def load_unet(path: str | Path, config_path: str | Path | None = None) -> MuseTalkUNet:
    """The UNet from `unet.pth` (plain state dict, diffusers names, no prefix) and its config, in eval mode.

    Args:
        path: the weights (musetalkV15/unet.pth; v1.0's musetalk/pytorch_model.bin has the same keys).
        config_path: the config; default `musetalk.json` beside the weights.

    Raises:
        CheckpointError: a file missing or unreadable, or keys missing, unexpected or mis-shaped
            (the message names them).
    """
    path = Path(path)
    config_file = Path(config_path) if config_path is not None else path.parent / UNET_CONFIG_NAME
    config = read_json_config(config_file)
    try:
        with torch.device("meta"):  # the weights come from the file: no initialisation of 850 M parameters
            model = build_unet(config)
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"model config {config_file} does not describe a UNet2DConditionModel: {exc}") from exc
    state_dict = clean_state_dict(read_state_dict_file(path))
    load_strict(model.unet, state_dict, source=str(path), assign=True)
    return model.eval()
