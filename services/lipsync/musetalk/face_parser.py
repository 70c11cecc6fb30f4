"""BiSeNet face parsing (19 CelebAMask-HQ classes), rebuilt key-for-key from face-parsing.PyTorch.

MuseTalk (`musetalk/utils/face_parsing`) parses the 1.5x crop around each avatar face with this network
to build the "jaw" mask its blend pastes through. The public `79999_iter.pth` is a plain state dict
loaded strictly: a ResNet-18 context path (`cp.resnet`, no classifier), two attention refinement
modules, the feature fusion module and three output heads (`conv_out`, `conv_out16`, `conv_out32`;
the last two are training's auxiliary heads: their weights are in the file and load, but only the
first output is ever used, so `forward` computes only it). The spatial path is deleted upstream: the
ResNet's 1/8 feature stands in for it. Input: RGB normalised with ImageNet's mean and std (MuseTalk
resizes the crop to 512x512 first).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from services.inference.checkpoints import clean_state_dict, load_strict, read_checkpoint

__all__ = ["FACE_PARSER_CLASSES", "IMAGENET_MEAN", "IMAGENET_STD", "BiSeNet", "load_face_parser"]

# The class of each output channel (CelebAMask-HQ's order).
FACE_PARSER_CLASSES = (
    "background",
    "skin",
    "l_brow",
    "r_brow",
    "l_eye",
    "r_eye",
    "eye_g",
    "l_ear",
    "r_ear",
    "ear_r",
    "nose",
    "mouth",
    "u_lip",
    "l_lip",
    "neck",
    "neck_l",
    "cloth",
    "hair",
    "hat",
)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class BasicBlock(nn.Module):
    """ResNet basic block: relu(shortcut(x) + bn2(conv2(relu(bn1(conv1(x)))))) with a 1x1 projection
    shortcut where the width or the stride changes."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample: nn.Sequential | None = None
        if cin != cout or stride != 1:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(shortcut + residual)


def _layer(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1))


class ResNet18(nn.Module):
    """The backbone without its classifier; returns the 1/8, 1/16 and 1/32 features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = _layer(64, 64, 1)
        self.layer2 = _layer(64, 128, 2)
        self.layer3 = _layer(128, 256, 2)
        self.layer4 = _layer(256, 512, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.layer1(self.maxpool(F.relu(self.bn1(self.conv1(x)))))
        feat8 = self.layer2(x)
        feat16 = self.layer3(feat8)
        return feat8, feat16, self.layer4(feat16)


class ConvBNReLU(nn.Module):
    """Conv (no bias) + BatchNorm + ReLU."""

    def __init__(self, cin: int, cout: int, kernel_size: int = 3, padding: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, 1, padding, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class AttentionRefinementModule(nn.Module):
    """Features times a channel gate: sigmoid(bn(1x1 conv(global mean of the features)))."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = ConvBNReLU(cin, cout)
        self.conv_atten = nn.Conv2d(cout, cout, 1, bias=False)
        self.bn_atten = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = self.conv(x)
        gate = torch.sigmoid(self.bn_atten(self.conv_atten(feat.mean(dim=(2, 3), keepdim=True))))
        return feat * gate


class ContextPath(nn.Module):
    """The ResNet's features refined top-down (nearest upsampling): returns the 1/8 backbone feature,
    the refined 1/8 and the refined 1/16 features."""

    def __init__(self) -> None:
        super().__init__()
        self.resnet = ResNet18()
        self.arm16 = AttentionRefinementModule(256, 128)
        self.arm32 = AttentionRefinementModule(512, 128)
        self.conv_head32 = ConvBNReLU(128, 128)
        self.conv_head16 = ConvBNReLU(128, 128)
        self.conv_avg = ConvBNReLU(512, 128, kernel_size=1, padding=0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        feat8, feat16, feat32 = self.resnet(x)
        # Global context: a 1x1 map, broadcast (upstream upsamples it "nearest" to the 1/32 size).
        context = self.conv_avg(feat32.mean(dim=(2, 3), keepdim=True))
        feat32_sum = self.arm32(feat32) + context
        feat32_up = self.conv_head32(F.interpolate(feat32_sum, feat16.shape[2:], mode="nearest"))
        feat16_sum = self.arm16(feat16) + feat32_up
        feat16_up = self.conv_head16(F.interpolate(feat16_sum, feat8.shape[2:], mode="nearest"))
        return feat8, feat16_up, feat32_up


class FeatureFusionModule(nn.Module):
    """1x1 conv of the concatenated paths, plus itself times a squeeze-excitation gate."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.convblk = ConvBNReLU(cin, cout, kernel_size=1, padding=0)
        self.conv1 = nn.Conv2d(cout, cout // 4, 1, bias=False)
        self.conv2 = nn.Conv2d(cout // 4, cout, 1, bias=False)

    def forward(self, spatial: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        feat = self.convblk(torch.cat([spatial, context], dim=1))
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(feat.mean(dim=(2, 3), keepdim=True)))))
        return feat * gate + feat


class BiSeNetOutput(nn.Module):
    """A head: ConvBNReLU 3x3, then a 1x1 conv (no bias) to the class scores."""

    def __init__(self, cin: int, mid: int, n_classes: int) -> None:
        super().__init__()
        self.conv = ConvBNReLU(cin, mid)
        self.conv_out = nn.Conv2d(mid, n_classes, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_out(self.conv(x))


class BiSeNet(nn.Module):
    """(B, 3, H, W) ImageNet-normalised RGB -> (B, 19, H, W) class scores (upstream's first output)."""

    def __init__(self, n_classes: int = len(FACE_PARSER_CLASSES)) -> None:
        super().__init__()
        self.cp = ContextPath()
        self.ffm = FeatureFusionModule(256, 256)
        self.conv_out = BiSeNetOutput(256, 256, n_classes)
        # Training's auxiliary heads: loaded (they are in the file), never run.
        self.conv_out16 = BiSeNetOutput(128, 64, n_classes)
        self.conv_out32 = BiSeNetOutput(128, 64, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat8, feat_cp8, _ = self.cp(x)
        scores = self.conv_out(self.ffm(feat8, feat_cp8))
        return F.interpolate(scores, x.shape[2:], mode="bilinear", align_corners=True)


def load_face_parser(path: str | Path) -> BiSeNet:
    """BiSeNet from `79999_iter.pth` (plain state dict, strict; the ResNet-18 is part of it), eval mode.

    Raises:
        CheckpointError: the file is unreadable, or keys are missing, unexpected or mis-shaped (named).
    """
    state_dict = clean_state_dict(read_checkpoint(path, entries=("state_dict",)))
    model = BiSeNet()
    load_strict(model, state_dict, source=str(path))
    # eval(): BatchNorm uses the stored running statistics, as upstream's inference does.
    return model.eval()
