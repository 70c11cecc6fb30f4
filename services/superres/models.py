"""Real-ESRGAN super-resolution networks, rebuilt key-for-key so the public checkpoints load strictly.

Architectures:
    * `SRVGGNetCompact` - the compact VGG-style net of Real-ESRGAN's "v3" models
      (realesr-general-x4v3, realesr-animevideov3). Source read: xinntao/Real-ESRGAN @a4abfb2,
      realesrgan/archs/srvgg_arch.py. Paper: Wang et al., "Real-ESRGAN: Training Real-World Blind
      Super-Resolution with Pure Synthetic Data", ICCVW 2021. Code licence: BSD-3-Clause.
    * `RRDBNet` - ESRGAN's Residual-in-Residual Dense Block generator (RealESRGAN_x4plus / x2plus).
      Source read: XPixelGroup/BasicSR @8d56e3a, basicsr/archs/rrdbnet_arch.py. Paper: Wang et al.,
      "ESRGAN: Enhanced Super-Resolution Generative Adversarial Networks", ECCVW 2018. Code licence:
      Apache-2.0.

The released weights carry their own terms (see the Real-ESRGAN repository); none are shipped here.
Attribute names and module order are load-bearing: they are the state-dict keys, checked against
tests/data/reference/{srvgg,rrdbnet}_keys.json. Training-only details (BasicSR's 0.1-scaled weight
init) are left out: every served model gets its weights from a checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from services.superres.loader import load_realesrgan

__all__ = ["SR_MODELS", "RRDBNet", "SRVGGNetCompact", "create_sr_model"]


# ---------------------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------------------


class ResidualDenseBlock(nn.Module):
    """Five densely connected 3x3 convs with a 0.2-scaled residual.

    Shapes: (B, num_feat, H, W) -> (B, num_feat, H, W).
    """

    def __init__(self, num_feat: int = 64, num_grow_ch: int = 32) -> None:
        super().__init__()
        # Conv k sees the block input plus the k-1 earlier growth outputs (dense connectivity).
        self.conv1 = nn.Conv2d(num_feat, num_grow_ch, 3, 1, 1)
        self.conv2 = nn.Conv2d(num_feat + num_grow_ch, num_grow_ch, 3, 1, 1)
        self.conv3 = nn.Conv2d(num_feat + 2 * num_grow_ch, num_grow_ch, 3, 1, 1)
        self.conv4 = nn.Conv2d(num_feat + 3 * num_grow_ch, num_grow_ch, 3, 1, 1)
        self.conv5 = nn.Conv2d(num_feat + 4 * num_grow_ch, num_feat, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.lrelu(self.conv1(x))
        x2 = self.lrelu(self.conv2(torch.cat((x, x1), 1)))
        x3 = self.lrelu(self.conv3(torch.cat((x, x1, x2), 1)))
        x4 = self.lrelu(self.conv4(torch.cat((x, x1, x2, x3), 1)))
        x5 = self.conv5(torch.cat((x, x1, x2, x3, x4), 1))
        # Residual scaling 0.2 keeps the very deep trunk stable (ESRGAN paper, sec. 3.1).
        return x5 * 0.2 + x


class RRDB(nn.Module):
    """Residual-in-Residual Dense Block: three dense blocks and an outer 0.2-scaled residual.

    Shapes: (B, num_feat, H, W) -> (B, num_feat, H, W).
    """

    def __init__(self, num_feat: int, num_grow_ch: int = 32) -> None:
        super().__init__()
        self.rdb1 = ResidualDenseBlock(num_feat, num_grow_ch)
        self.rdb2 = ResidualDenseBlock(num_feat, num_grow_ch)
        self.rdb3 = ResidualDenseBlock(num_feat, num_grow_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.rdb3(self.rdb2(self.rdb1(x)))
        return out * 0.2 + x


def _activation(act_type: str, num_feat: int) -> nn.Module:
    """The SRVGG activation; only PReLU has parameters (one slope per channel)."""
    if act_type == "prelu":
        return nn.PReLU(num_parameters=num_feat)
    if act_type == "relu":
        return nn.ReLU(inplace=True)
    if act_type == "leakyrelu":
        # Upstream uses slope 0.1 here (not the 0.2 of RRDBNet).
        return nn.LeakyReLU(negative_slope=0.1, inplace=True)
    raise ValueError(f"unknown act_type {act_type!r}; expected 'prelu', 'relu' or 'leakyrelu'")


# ---------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------


class SRVGGNetCompact(nn.Module):
    """Compact VGG-style SR net: plain conv stack, PixelShuffle, plus a nearest-upsampled skip.

    `body` is one flat ModuleList (conv, act, conv, act, ..., conv) because the checkpoints index it
    that way: even indices are convs, odd ones activations.

    Args:
        num_in_ch: input channels (3, RGB).
        num_out_ch: output channels (3, RGB); must equal `num_in_ch` for the skip connection.
        num_feat: feature width.
        num_conv: number of hidden conv+act pairs after the first one (32 for general-x4v3,
            16 for animevideov3).
        upscale: integer scale factor.
        act_type: "prelu" (all released models), "relu" or "leakyrelu".

    Shapes: (B, num_in_ch, H, W) float in [0, 1] -> (B, num_out_ch, H*upscale, W*upscale).
    """

    def __init__(
        self,
        num_in_ch: int = 3,
        num_out_ch: int = 3,
        num_feat: int = 64,
        num_conv: int = 32,
        upscale: int = 4,
        act_type: str = "prelu",
    ) -> None:
        super().__init__()
        self.num_in_ch = num_in_ch
        self.num_out_ch = num_out_ch
        self.num_feat = num_feat
        self.num_conv = num_conv
        self.upscale = upscale
        self.act_type = act_type

        self.body = nn.ModuleList([nn.Conv2d(num_in_ch, num_feat, 3, 1, 1), _activation(act_type, num_feat)])
        for _ in range(num_conv):
            self.body.append(nn.Conv2d(num_feat, num_feat, 3, 1, 1))
            self.body.append(_activation(act_type, num_feat))
        # The last conv emits upscale^2 sub-pixels per output channel for PixelShuffle.
        self.body.append(nn.Conv2d(num_feat, num_out_ch * upscale * upscale, 3, 1, 1))
        self.upsampler = nn.PixelShuffle(upscale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for layer in self.body:
            out = layer(out)
        out = self.upsampler(out)
        # The network only learns a residual over nearest-neighbour upsampling.
        return out + F.interpolate(x, scale_factor=self.upscale, mode="nearest")


class RRDBNet(nn.Module):
    """ESRGAN generator: RRDB trunk, then two nearest x2 upsample + conv stages.

    The trunk always upsamples x4; for `scale` 2 (1) the input is first pixel-unshuffled by 2 (4) so
    the same x4 trunk yields the requested scale. Unshuffled channel index is c*r*r + dy*r + dx,
    which is exactly `F.pixel_unshuffle` (and BasicSR's own view/permute version).

    Args:
        num_in_ch: input channels (3, RGB).
        num_out_ch: output channels (3, RGB).
        scale: 4, 2 or 1. For 2 (1) H and W must be multiples of 2 (4).
        num_feat: trunk width.
        num_block: number of RRDBs (23 in the released models).
        num_grow_ch: growth channels of each dense conv.

    Shapes: (B, num_in_ch, H, W) float in [0, 1] -> (B, num_out_ch, H*scale, W*scale).
    """

    def __init__(
        self,
        num_in_ch: int = 3,
        num_out_ch: int = 3,
        scale: int = 4,
        num_feat: int = 64,
        num_block: int = 23,
        num_grow_ch: int = 32,
    ) -> None:
        super().__init__()
        if scale not in (1, 2, 4):
            raise ValueError(f"RRDBNet scale must be 1, 2 or 4, got {scale}")
        self.scale = scale
        self._unshuffle = {4: 1, 2: 2, 1: 4}[scale]
        self.conv_first = nn.Conv2d(num_in_ch * self._unshuffle**2, num_feat, 3, 1, 1)
        self.body = nn.Sequential(*(RRDB(num_feat, num_grow_ch) for _ in range(num_block)))
        self.conv_body = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_up1 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_up2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_hr = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_last = nn.Conv2d(num_feat, num_out_ch, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = F.pixel_unshuffle(x, self._unshuffle) if self._unshuffle > 1 else x
        feat = self.conv_first(feat)
        feat = feat + self.conv_body(self.body(feat))
        feat = self.lrelu(self.conv_up1(F.interpolate(feat, scale_factor=2, mode="nearest")))
        feat = self.lrelu(self.conv_up2(F.interpolate(feat, scale_factor=2, mode="nearest")))
        return self.conv_last(self.lrelu(self.conv_hr(feat)))


# ---------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------

# Metadata as data: the public model names, how to build each, and which checkpoint entries hold
# the weights (EMA first, as RealESRGANer does; the v3 files only carry `params`).
SR_MODELS: dict[str, dict[str, Any]] = {
    "realesr-general-x4v3": {"arch": "srvgg", "num_conv": 32, "scale": 4, "weights_entry": ["params_ema", "params"]},
    "realesr-animevideov3": {"arch": "srvgg", "num_conv": 16, "scale": 4, "weights_entry": ["params_ema", "params"]},
    "RealESRGAN_x4plus": {"arch": "rrdb", "scale": 4, "weights_entry": ["params_ema", "params"]},
    "RealESRGAN_x2plus": {"arch": "rrdb", "scale": 2, "weights_entry": ["params_ema", "params"]},
}


def create_sr_model(name: str, checkpoint: str | Path | None = None) -> nn.Module:
    """Build a registered model, load `checkpoint` strictly if given, and return it in eval mode.

    Args:
        name: a key of `SR_MODELS`.
        checkpoint: a Real-ESRGAN `.pth` file; None leaves the default (random) init, which is only
            useful for tests, shape checks and export.

    Raises:
        ValueError: unknown `name`.
        CheckpointError: the file is unreadable or does not fit the architecture.
    """
    if name not in SR_MODELS:
        raise ValueError(f"unknown super-resolution model {name!r}; known: {', '.join(SR_MODELS)}")
    meta = SR_MODELS[name]
    model: nn.Module
    if meta["arch"] == "srvgg":
        model = SRVGGNetCompact(num_conv=meta["num_conv"], upscale=meta["scale"])
    else:
        model = RRDBNet(scale=meta["scale"])
    if checkpoint is not None:
        return load_realesrgan(model, checkpoint, entries=meta["weights_entry"])
    return model.eval()
