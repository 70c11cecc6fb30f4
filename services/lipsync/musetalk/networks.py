"""The tier's networks as the stage runs them: the whisper encoder and the generator (UNet, one step,
then the VAE decoder) from the configured checkpoints, or the weight-free stand-in
(services/lipsync/musetalk/standin.py) when none is configured.

The loaders are services/lipsync/musetalk/{unet,vae,whisper}.py's (each checks its file key for key
and fails start-up naming what is missing or unexpected); this module only assembles what one batch
runs, as upstream's realtime inference does:

    tokens [B, 50, 384] (10 positions x 5 hidden states) + positional encoding
      -> UNet(latents [B, 8, 32, 32], timestep 0, tokens) -> latent [B, 4, 32, 32]
      -> / 0.18215 -> VAE decode -> (x / 2 + 0.5).clamp(0, 1): RGB faces [B, 3, 256, 256]

so that one backend (fp16, channels_last, torch.compile, static batch buckets) runs it whole.

Fast decode (the stage's `fast_decode`, off by default; docs/architecture.md section 12.2): the VAE
decodes only latent rows FAST_DECODE_FIRST_ROW..31 (pixel rows 96..255) and the rows above are black.
The avatar's alpha is cut at the crop's middle row (pixel 128) before its Gaussian blur of kernel 0.1 x
the mask square's side (1.5 x the face box), so it reaches at most ~0.075 x 256 = 19 face rows higher,
to row ~109: rows 0..95 are never composited, and the 13 rows between 96 and 109 keep the top edge of
the decoded strip (its zero padding) away from what is. The decoder sees 20 of 32 rows, so its
mid-block attention (global) and its GroupNorm statistics differ from the whole decode: not exact;
the measured difference is in docs/architecture.md section 12.2.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import torch
from torch import nn

from services.lipsync.musetalk.standin import (
    LATENT_SCALE,
    MODEL_NAME,
    LatentCodec,
    StandInGenerator,
    StandInVAE,
    StandInWhisperEncoder,
)
from services.lipsync.musetalk.unet import load_unet
from services.lipsync.musetalk.vae import load_vae
from services.lipsync.musetalk.whisper import load_whisper_encoder, positional_table

__all__ = ["FAST_DECODE_FIRST_ROW", "MuseTalkGenerator", "Networks", "load_networks", "standin_networks"]

#: the first latent row the fast decode decodes (of 32; 8 pixel rows each): 12 -> pixel rows 96..255
FAST_DECODE_FIRST_ROW = 12
FAST_DECODE_SUFFIX = "+fast-decode"
LATENT_ROWS = 32
PIXELS_PER_LATENT_ROW = 8


class MuseTalkGenerator(nn.Module):
    """One UNet step and the VAE decode: (latents [B, 8, 32, 32], audio tokens [B, 50, 384]) -> faces
    [B, 3, 256, 256] in [0, 1], RGB (see the module docstring).

    `fast_decode_row`: None decodes all 32 latent rows (exact); a row r decodes rows r..31 only and
    leaves the output's pixel rows above 8 r black (not exact: the module docstring). The row is also
    a buffer, so it is part of the compile cache's key (the two compile to different graphs).
    """

    model_name = "musetalk"
    positions: torch.Tensor  # (50, 384), a buffer

    def __init__(self, unet: nn.Module, vae: nn.Module, fast_decode_row: int | None = None) -> None:
        super().__init__()
        if not isinstance(vae, nn.Module):
            raise TypeError(f"the VAE must be an nn.Module (it is moved and cast with the generator), got {type(vae)}")
        if fast_decode_row is not None and not 0 < fast_decode_row < LATENT_ROWS:
            raise ValueError(f"fast_decode_row must lie in 1..{LATENT_ROWS - 1}, got {fast_decode_row}")
        self.unet = unet
        self.vae = vae
        self.fast_decode_row = fast_decode_row
        self.register_buffer("decoded_from_row", torch.tensor(fast_decode_row or 0, dtype=torch.int64))
        # MuseTalk's positional encoding as a buffer: cast to the backend's dtype (as upstream's pe.half())
        # and moved to its device with the weights, so the compiled graph / CUDA graph holds no CPU work.
        self.register_buffer("positions", positional_table(), persistent=False)

    def forward(self, latents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1:] != self.positions.shape:
            raise ValueError(
                f"audio tokens must be (B, {', '.join(map(str, self.positions.shape))}), got {tuple(tokens.shape)}"
            )
        tokens = tokens + self.positions.to(tokens.dtype)
        timestep = torch.zeros(latents.shape[0], dtype=torch.long, device=latents.device)
        predicted = self.unet(latents, timestep, tokens)
        row = self.fast_decode_row
        if row is not None:
            predicted = predicted[:, :, row:]
        image = cast(LatentCodec, self.vae).decode(predicted / LATENT_SCALE)
        faces = (image / 2 + 0.5).clamp(0.0, 1.0)
        if row is not None:  # the rows above the decoded strip: black (never composited)
            top = faces.new_zeros((faces.shape[0], faces.shape[1], row * PIXELS_PER_LATENT_ROW, faces.shape[3]))
            faces = torch.cat((top, faces), dim=2)
        return faces


@dataclasses.dataclass
class Networks:
    """What the stage runs: `encoder` ([W, 80, 3000] -> [W, 1500, 5, 384]) and `generator` per batch,
    `vae` (its encode) at avatar preparation; `name` is what the stage reports."""

    name: str
    encoder: nn.Module
    generator: nn.Module
    vae: nn.Module

    @property
    def standin(self) -> bool:
        return self.name == MODEL_NAME


def standin_networks() -> Networks:
    generator = StandInGenerator()
    return Networks(MODEL_NAME, StandInWhisperEncoder(), generator, StandInVAE())


def load_networks(unet: str, unet_config: str, vae: str, whisper: str, fast_decode: bool = False) -> Networks:
    """The MuseTalk 1.5 networks from the public checkpoint layout (fp32, on the CPU: the backends
    copy, cast and move them); `fast_decode` decodes only the latent rows the alpha uses (not exact:
    the module docstring) and names the model `musetalk+fast-decode`."""
    unet_module = load_unet(unet, unet_config)  # musetalk.json: beside unet.pth upstream, a setting here
    vae_module = load_vae(vae)
    encoder = load_whisper_encoder(whisper)
    row = FAST_DECODE_FIRST_ROW if fast_decode else None
    name = "musetalk" + (FAST_DECODE_SUFFIX if fast_decode else "")
    return Networks(name, encoder, MuseTalkGenerator(unet_module, vae_module, row), vae_module)
