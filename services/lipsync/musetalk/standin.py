"""The weight-free stand-in of the musetalk tier: the same modules, shapes and pipeline as the MuseTalk
1.5 networks, no checkpoints, fast on a CPU (docs/architecture.md section 12).

Used when the stage has no generator checkpoints, so the tier's whole path (avatar preparation,
LatentBank, audio windows, batching, 256 x 256 faces, compositing) runs in CI and the demo. It is
reported as `musetalk-standin` in `Job.models`, the first Generate response and
`lipline_backend_info`. What each part does:

- `StandInVAE`: an 8x area-mean "encoder" (the RGB means of each 8 x 8 block, and their luma, as the 4
  latent channels at 32 x 32) and a bicubic "decoder" of the 3 colour channels back to 256 x 256: the
  real VAE's shapes and value range ([-1, 1]); a decoded face is the crop blurred to 32 x 32 detail.
- `StandInWhisperEncoder`: per encoder position (20 ms) how open a mouth should be, from the log-mel
  window's loudness: the mean over the 80 bands of the position's two columns, closed at the window's
  floor (whisper clamps its log-mel at the window's maximum - 8, i.e. 2.0 below its top after the
  (x + 4) / 4 scaling) and at an absolute floor (silence and a quiet room), open 0.5 above; the value
  fills all 5 x 384 features of the position, so it survives the tier's gather of 10 positions per frame.
- `StandInGenerator`: (latents [B, 8, 32, 32], tokens [B, 50, 384]) -> faces [B, 3, 256, 256] in
  [0, 1], RGB: the reference latent (channels 4-7) decoded, a dark inner mouth drawn over it, as tall
  as the opening of the frame's middle four positions (80 ms around the frame). Pixels outside the
  mouth are the decoded reference exactly, so silence gives the same face on every frame.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LATENT_SCALE", "MODEL_NAME", "LatentCodec", "StandInGenerator", "StandInVAE", "StandInWhisperEncoder"]

MODEL_NAME = "musetalk-standin"
LATENT_SCALE = 0.18215  # the VAE's scaling factor: prepared latents are mean x this; the UNet's output / this
FACE = 256
LATENT = 32
HIDDEN_STATES = 5
WIDTH = 384
POSITIONS = 1500
# Loudness in whisper's scaled log-mel ((log10 + 4) / 4), the mean over the bands of one column: the
# window's floor is its top - 2.0; speech on samples/speech.wav sits 0.6-0.9 above it (median band
# mean 0.07, its digital silence -0.71), a -60 dBFS room about -0.6 absolute. Closed at the higher of
# floor + RELATIVE_CLOSED and ABSOLUTE_CLOSED, fully open OPEN_RANGE above it.
RELATIVE_CLOSED = 0.35
ABSOLUTE_CLOSED = -0.45
OPEN_RANGE = 0.5
# The mouth in the 256 x 256 MuseTalk crop: the box's vertical centre is the nose (landmark 29), its
# bottom the chin + 10 px, so the lips sit about three quarters down, horizontally centred.
MOUTH_CX, MOUTH_CY = 128.0, 196.0
MOUTH_HALF_WIDTH = 30.0
MOUTH_MAX_HALF_HEIGHT = 16.0
INNER_MOUTH_RGB = (0.24, 0.07, 0.08)
MAX_DARKNESS = 0.9
EDGE_SOFTNESS = 0.35
MIN_VISIBLE_HALF_HEIGHT = 1.5
FRAME_POSITIONS = (3, 4, 5, 6)  # of the item's 10 positions (4 before it .. 6 after): the frame's 80 ms


class LatentCodec(Protocol):
    """What the tier calls of a VAE (services/lipsync/musetalk/vae.py's, or the stand-in's)."""

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def decode(self, z: torch.Tensor) -> torch.Tensor: ...


class StandInVAE(nn.Module):
    """8x area means for `encode`, bicubic for `decode`: the VAE's interface (see the module docstring)."""

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, 3, 256, 256] RGB in [-1, 1] -> (mean, logvar), each [B, 4, 32, 32] (logvar: zeros)."""
        colour = F.avg_pool2d(x, FACE // LATENT)
        luma = (colour * torch.tensor([0.299, 0.587, 0.114], device=x.device, dtype=x.dtype).view(1, 3, 1, 1)).sum(
            1, keepdim=True
        )
        mean = torch.cat((colour, luma), dim=1)
        return mean, torch.zeros_like(mean)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """[B, 4, 32, 32] -> [B, 3, 256, 256] in [-1, 1] (before upstream's / 2 + 0.5)."""
        return F.interpolate(z[:, :3], size=(FACE, FACE), mode="bicubic", align_corners=False).clamp(-1.0, 1.0)


class StandInWhisperEncoder(nn.Module):
    """[W, 80, 3000] log-mel -> [W, 1500, 5, 384]: each position's mouth opening in [0, 1] (a view:
    one value per position in memory)."""

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        level = input_features.float().mean(dim=1)  # [W, 3000]
        level = level.view(level.shape[0], POSITIONS, 2).mean(dim=2)  # [W, 1500]: 20 ms each
        top = input_features.float().amax(dim=(1, 2)).view(-1, 1)
        closed = torch.maximum(top - 2.0 + RELATIVE_CLOSED, torch.full_like(top, ABSOLUTE_CLOSED))
        opening = ((level - closed) / OPEN_RANGE).clamp(0.0, 1.0).to(input_features.dtype)
        return opening[:, :, None, None].expand(-1, -1, HIDDEN_STATES, WIDTH)


class StandInGenerator(nn.Module):
    """The UNet + VAE decode stand-in: (latents, tokens) -> faces in [0, 1] (see the module docstring)."""

    model_name = MODEL_NAME

    def __init__(self) -> None:
        super().__init__()
        self.vae = StandInVAE()

    def forward(self, latents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        reference = self.vae.decode(latents[:, 4:8] / LATENT_SCALE)
        face = (reference / 2 + 0.5).clamp(0.0, 1.0)
        rows = [t * HIDDEN_STATES for t in FRAME_POSITIONS]  # hidden state 0 of each of those positions
        opening = tokens[:, rows, 0].float().mean(dim=1).clamp(0.0, 1.0).view(-1, 1, 1)
        device = face.device
        ys = torch.arange(FACE, device=device, dtype=torch.float32).view(1, FACE, 1)
        xs = torch.arange(FACE, device=device, dtype=torch.float32).view(1, 1, FACE)
        half_h = opening * MOUTH_MAX_HALF_HEIGHT
        r = torch.sqrt(((xs - MOUTH_CX) / MOUTH_HALF_WIDTH) ** 2 + ((ys - MOUTH_CY) / half_h.clamp_min(1e-3)) ** 2)
        alpha = ((1.0 - r) / EDGE_SOFTNESS).clamp(0.0, 1.0) * MAX_DARKNESS
        alpha = (alpha * (half_h / MIN_VISIBLE_HALF_HEIGHT).clamp(0.0, 1.0)).unsqueeze(1).to(face.dtype)
        colour = torch.tensor(INNER_MOUTH_RGB, device=device, dtype=face.dtype).view(1, 3, 1, 1)
        mouth = face * (1.0 - alpha) + colour * alpha
        return torch.where(alpha > 0, mouth, face)
