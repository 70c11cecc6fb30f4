"""Wav2Lip generator (Prajwal et al., 2020), rebuilt key-for-key from upstream models/wav2lip.py.

The module tree, parameter names and their order match the upstream state dict exactly
(tests/data/reference/wav2lip_keys.json), so the public `wav2lip.pth` / `wav2lip_gan.pth` files
load strictly. Inputs: mel windows (B, 1, 80, 16) and 6-channel faces (B, 6, 96, 96) in [0, 1]
(channels 0-2 lower-half-masked target, 3-5 unmasked reference, BGR). Output: (B, 3, 96, 96)
BGR in [0, 1].
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from services.inference.checkpoints import clean_state_dict, load_strict, read_checkpoint

__all__ = [
    "WAV2LIP_INFO",
    "Conv2dBlock",
    "ConvTranspose2dBlock",
    "Wav2Lip",
    "checkpoint_filter_fn",
    "load_wav2lip",
    "create_wav2lip",
]

# What the public checkpoints were trained with (hparams.py / inference.py); data, not code paths.
WAV2LIP_INFO: dict[str, int] = {"img_size": 96, "mel_step_size": 16, "fps": 25}

_Pair = int | tuple[int, int]


class Conv2dBlock(nn.Module):
    """Conv2d + BatchNorm2d (+ identity residual) + ReLU: upstream `models.conv.Conv2d`.

    The attribute names (`conv_block.0`, `conv_block.1`) are the checkpoint's key names.
    """

    def __init__(
        self, cin: int, cout: int, kernel_size: _Pair, stride: _Pair, padding: _Pair, residual: bool = False
    ) -> None:
        super().__init__()
        self.conv_block = nn.Sequential(nn.Conv2d(cin, cout, kernel_size, stride, padding), nn.BatchNorm2d(cout))
        self.act = nn.ReLU()
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv_block(x)
        if self.residual:
            # Upstream adds the input after BN and before the ReLU.
            out = out + x
        return self.act(out)


class ConvTranspose2dBlock(nn.Module):
    """ConvTranspose2d + BatchNorm2d + ReLU (never residual): upstream `models.conv.Conv2dTranspose`."""

    def __init__(
        self, cin: int, cout: int, kernel_size: int, stride: int, padding: int, output_padding: int = 0
    ) -> None:
        super().__init__()
        self.conv_block = nn.Sequential(
            nn.ConvTranspose2d(cin, cout, kernel_size, stride, padding, output_padding),
            nn.BatchNorm2d(cout),
        )
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv_block(x))


def _res(ch: int) -> Conv2dBlock:
    """The ubiquitous shape-preserving residual 3x3 block."""
    return Conv2dBlock(ch, ch, 3, 1, 1, residual=True)


def _up(cin: int, cout: int) -> ConvTranspose2dBlock:
    """x2 upsampling transposed conv (3x3, stride 2, pad 1, output_padding 1)."""
    return ConvTranspose2dBlock(cin, cout, 3, 2, 1, output_padding=1)


class Wav2Lip(nn.Module):
    """The Wav2Lip generator: face U-Net encoder, audio encoder, decoder with skip connections."""

    model_name = "wav2lip"

    def __init__(self) -> None:
        super().__init__()
        C = Conv2dBlock
        self.face_encoder_blocks = nn.ModuleList(
            [
                nn.Sequential(C(6, 16, 7, 1, 3)),  # 96x96
                nn.Sequential(C(16, 32, 3, 2, 1), _res(32), _res(32)),  # 48x48
                nn.Sequential(C(32, 64, 3, 2, 1), _res(64), _res(64), _res(64)),  # 24x24
                nn.Sequential(C(64, 128, 3, 2, 1), _res(128), _res(128)),  # 12x12
                nn.Sequential(C(128, 256, 3, 2, 1), _res(256), _res(256)),  # 6x6
                nn.Sequential(C(256, 512, 3, 2, 1), _res(512)),  # 3x3
                nn.Sequential(C(512, 512, 3, 1, 0), C(512, 512, 1, 1, 0)),  # 1x1
            ]
        )
        # Mel window (1, 80, 16) -> (512, 1, 1): 80x16 -> 27x16 -> 9x6 -> 3x3 -> 1x1.
        self.audio_encoder = nn.Sequential(
            C(1, 32, 3, 1, 1),
            _res(32),
            _res(32),
            C(32, 64, 3, (3, 1), 1),
            _res(64),
            _res(64),
            C(64, 128, 3, 3, 1),
            _res(128),
            _res(128),
            C(128, 256, 3, (3, 2), 1),
            _res(256),
            C(256, 512, 3, 1, 0),
            C(512, 512, 1, 1, 0),
        )
        # Each stage's input is the previous output concatenated with the matching encoder feature.
        self.face_decoder_blocks = nn.ModuleList(
            [
                nn.Sequential(C(512, 512, 1, 1, 0)),  # 1x1
                nn.Sequential(ConvTranspose2dBlock(1024, 512, 3, 1, 0), _res(512)),  # 3x3
                nn.Sequential(_up(1024, 512), _res(512), _res(512)),  # 6x6
                nn.Sequential(_up(768, 384), _res(384), _res(384)),  # 12x12
                nn.Sequential(_up(512, 256), _res(256), _res(256)),  # 24x24
                nn.Sequential(_up(320, 128), _res(128), _res(128)),  # 48x48
                nn.Sequential(_up(160, 64), _res(64), _res(64)),  # 96x96
            ]
        )
        self.output_block = nn.Sequential(C(80, 32, 3, 1, 1), nn.Conv2d(32, 3, 1, 1, 0), nn.Sigmoid())

    def forward(self, audio_sequences: torch.Tensor, face_sequences: torch.Tensor) -> torch.Tensor:
        """(B, 1, 80, 16) mel + (B, 6, 96, 96) faces -> (B, 3, 96, 96) in [0, 1]."""
        feats = []
        x = face_sequences
        for block in self.face_encoder_blocks:
            x = block(x)
            feats.append(x)
        x = self.audio_encoder(audio_sequences)
        for block in self.face_decoder_blocks:
            x = torch.cat((block(x), feats.pop()), dim=1)
        return self.output_block(x)


def checkpoint_filter_fn(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map a checkpoint's state dict onto our keys (public files carry DataParallel's `module.`)."""
    return clean_state_dict(state_dict)


def load_wav2lip(path: str | Path, device: str | torch.device = "cpu") -> Wav2Lip:
    """Build Wav2Lip from a `.pth` file (weights under `state_dict`, or a bare state dict), in eval mode.

    Raises CheckpointError naming missing/unexpected/mis-shaped keys when the file does not fit.
    """
    state_dict = checkpoint_filter_fn(read_checkpoint(path, entries=("state_dict",)))
    model = Wav2Lip()
    load_strict(model, state_dict, source=str(path))
    # eval(): BatchNorm must use the stored running statistics, as upstream inference does.
    return model.to(device).eval()


def create_wav2lip(checkpoint: str | Path | None = None, device: str | torch.device = "cpu") -> Wav2Lip:
    """Wav2Lip with weights from `checkpoint`, or randomly initialised (eval mode) when None."""
    if checkpoint is not None:
        return load_wav2lip(checkpoint, device=device)
    return Wav2Lip().to(device).eval()
