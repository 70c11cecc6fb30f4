"""DWPose whole-body landmarks for the MuseTalk tier's face box, as a plain-torch port.

Upstream MuseTalk finds its 256x256 face box from DWPose (`dw-ll_ucoco_384.pth`): mmpose's RTMPose-l
top-down model (mmdet's CSPNeXt-P5 backbone, an RTMCC head with a gated attention unit, SimCC
decoding with split ratio 2.0) on a 384x288 input, 133 COCO-WholeBody keypoints of which 23-90 are
the 68 face landmarks. mmpose/mmcv cannot be installed here, so the network, its preprocessing and
its decode are rebuilt here with the checkpoint's module tree and key names, and the public file
loads key-for-key (docs/architecture.md, "The tier's landmarks").

What upstream does per frame, and this module repeats:
1. the WHOLE frame is the person box: centre = the frame's centre, scale = its size x 1.25
   (mmpose's `GetBBoxCenterScale` padding), widened to the input's 3:4 aspect (`TopdownAffine`);
2. the frame (BGR uint8) is warped to 288x384 with that affine (bilinear, black outside), turned
   RGB and normalised with the ImageNet mean/std of the config;
3. the network runs on the input and on its horizontal mirror; the mirror's SimCC vectors are
   mapped back (keypoints swapped by `FLIP_INDICES`, x bins reversed) and the two are averaged;
4. each keypoint is the argmax bin / 2 in input pixels (-1 bins where the score is not positive),
   mapped back to the frame by the inverse of step 1.
Then MuseTalk's v1.5 box is `musetalk_box` of the 68 face landmarks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from services.inference.checkpoints import clean_state_dict, load_strict, read_checkpoint
from services.media.crops import Box

__all__ = [
    "BBOX_PADDING",
    "FACE_KEYPOINTS",
    "FLIP_INDICES",
    "INPUT_SIZE_WH",
    "MEAN_RGB",
    "NUM_KEYPOINTS",
    "SIMCC_SPLIT_RATIO",
    "STD_RGB",
    "RTMPoseWholeBody",
    "box_from_face_detection",
    "decode_simcc",
    "face_landmarks",
    "face_landmarks_batch",
    "flip_simcc",
    "input_to_frame",
    "load_landmarker",
    "musetalk_box",
    "preprocess",
    "whole_body_keypoints",
    "whole_body_keypoints_batch",
    "whole_frame_affine",
]

# The config (rtmpose-l_8xb32-270e_coco-ubody-wholebody-384x288): data, not code paths.
INPUT_SIZE_WH: tuple[int, int] = (288, 384)
SIMCC_SPLIT_RATIO = 2.0
BBOX_PADDING = 1.25  # mmpose GetBBoxCenterScale's default; the config does not override it
MEAN_RGB: tuple[float, float, float] = (123.675, 116.28, 103.53)
STD_RGB: tuple[float, float, float] = (58.395, 57.12, 57.375)
NUM_KEYPOINTS = 133
FACE_KEYPOINTS = slice(23, 91)  # COCO-WholeBody 'face-0'..'face-67' = the 68-point face
# COCO-WholeBody's mirror pairs (mmpose dataset meta, `flip_indices`), used by the flip test.
FLIP_INDICES: tuple[int, ...] = (
    (0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15, 20, 21, 22, 17, 18, 19)
    + (39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23)  # jaw
    + (49, 48, 47, 46, 45, 44, 43, 42, 41, 40)  # brows
    + (50, 51, 52, 53, 58, 57, 56, 55, 54)  # nose
    + (68, 67, 66, 65, 70, 69, 62, 61, 60, 59, 64, 63)  # eyes
    + (77, 76, 75, 74, 73, 72, 71, 82, 81, 80, 79, 78, 87, 86, 85, 84, 83, 90, 89, 88)  # mouth
    + tuple(range(112, 133))
    + tuple(range(91, 112))  # hands swap
)
# The MuseTalk v1.5 box (musetalk/utils/preprocessing.py, scripts/inference.py).
NOSE_LANDMARK = 29  # 68-point numbering: the lower nose bridge, the box's vertical centre
EXTRA_MARGIN = 10  # v1.5's px below the chin


# -- the network: module tree and key names of mmdet's CSPNeXt and mmpose's RTMCCHead -------------


class ConvModule(nn.Module):
    """mmcv ConvModule as configured here: conv (no bias) + BatchNorm (eps 1e-5) + SiLU."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-5)
        self.activate = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activate(self.bn(self.conv(x)))


class DepthwiseSeparableConvModule(nn.Module):
    """mmcv's depthwise k x k ConvModule followed by a pointwise 1x1 ConvModule (both BN + SiLU)."""

    def __init__(self, cin: int, cout: int, kernel: int) -> None:
        super().__init__()
        self.depthwise_conv = ConvModule(cin, cin, kernel, groups=cin)
        self.pointwise_conv = ConvModule(cin, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise_conv(self.depthwise_conv(x))


class CSPNeXtBlock(nn.Module):
    """3x3 conv, then a 5x5 depthwise-separable conv; plus the input when `add_identity`."""

    def __init__(self, channels: int, add_identity: bool) -> None:
        super().__init__()
        self.conv1 = ConvModule(channels, channels, 3)
        self.conv2 = DepthwiseSeparableConvModule(channels, channels, 5)
        self.add_identity = add_identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(self.conv1(x))
        return out + x if self.add_identity else out


class ChannelAttention(nn.Module):
    """x * hardsigmoid(fc(global average of x)): mmdet's ChannelAttention."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.fc = nn.Conv2d(channels, channels, 1, bias=True)
        self.act = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.act(self.fc(F.adaptive_avg_pool2d(x, 1)))


class CSPLayer(nn.Module):
    """Cross-stage partial layer: blocks on one half, a 1x1 shortcut on the other, attention, 1x1."""

    def __init__(self, cin: int, cout: int, num_blocks: int, add_identity: bool, expand_ratio: float = 0.5) -> None:
        super().__init__()
        mid = int(cout * expand_ratio)
        # Registration order = the checkpoint's key order.
        self.main_conv = ConvModule(cin, mid, 1)
        self.short_conv = ConvModule(cin, mid, 1)
        self.final_conv = ConvModule(2 * mid, cout, 1)
        self.blocks = nn.Sequential(*[CSPNeXtBlock(mid, add_identity) for _ in range(num_blocks)])
        self.attention = ChannelAttention(2 * mid)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_main = self.blocks(self.main_conv(x))
        x_cat = torch.cat((x_main, self.short_conv(x)), dim=1)
        return self.final_conv(self.attention(x_cat))


class SPPBottleneck(nn.Module):
    """1x1 conv, then [x, maxpool 5, 9, 13 of x] (stride 1, same size) concatenated, 1x1 conv."""

    KERNELS = (5, 9, 13)

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        mid = cin // 2
        self.conv1 = ConvModule(cin, mid, 1)
        self.poolings = nn.ModuleList([nn.MaxPool2d(k, stride=1, padding=k // 2) for k in self.KERNELS])
        self.conv2 = ConvModule(mid * (len(self.KERNELS) + 1), cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        return self.conv2(torch.cat([x] + [pool(x) for pool in self.poolings], dim=1))


class CSPNeXt(nn.Module):
    """mmdet's CSPNeXt, arch P5, out_indices (4,): the stride-32 feature map only."""

    # in, out, blocks, add_identity, spp (arch P5)
    ARCH_P5 = (
        (64, 128, 3, True, False),
        (128, 256, 6, True, False),
        (256, 512, 6, True, False),
        (512, 1024, 3, False, True),
    )

    def __init__(self, widen_factor: float = 1.0, deepen_factor: float = 1.0) -> None:
        super().__init__()
        stem = int(self.ARCH_P5[0][0] * widen_factor)
        self.stem = nn.Sequential(
            ConvModule(3, stem // 2, 3, 2), ConvModule(stem // 2, stem // 2, 3), ConvModule(stem // 2, stem, 3)
        )
        for i, (cin, cout, blocks, identity, spp) in enumerate(self.ARCH_P5):
            cin, cout = int(cin * widen_factor), int(cout * widen_factor)
            layers: list[nn.Module] = [ConvModule(cin, cout, 3, 2)]
            if spp:
                layers.append(SPPBottleneck(cout, cout))
            layers.append(CSPLayer(cout, cout, max(round(blocks * deepen_factor), 1), identity))
            self.add_module(f"stage{i + 1}", nn.Sequential(*layers))
        self.out_channels = int(self.ARCH_P5[-1][1] * widen_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i in range(1, 5):
            x = getattr(self, f"stage{i}")(x)
        return x


class ScaleNorm(nn.Module):
    """x / max(||x|| * dim^-0.5, eps) * g over the last dimension (one learned scalar g)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.scale = dim**-0.5
        self.eps = eps
        self.g = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = torch.norm(x, dim=2, keepdim=True) * self.scale
        return x / norm.clamp(min=self.eps) * self.g


class Scale(nn.Module):
    """Element-wise learned scale vector."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class RTMCCBlock(nn.Module):
    """mmpose's gated attention unit over the keypoint tokens (self-attention, no relative bias, no RoPE).

    u, v, base = split(SiLU(uv(scalenorm(x)))); q, k = base * gamma + beta; the attention kernel is
    relu(q k^T / sqrt(s))^2 (no softmax); out = res_scale * x + o(u * (kernel @ v)).
    """

    def __init__(self, tokens: int, dims: int, expansion_factor: int = 2, s: int = 128) -> None:
        super().__init__()
        self.e = int(dims * expansion_factor)
        self.s = s
        self.num_token = tokens
        # Parameters first, then submodules in the checkpoint's order: gamma, beta, o, uv, ln, res_scale.
        self.gamma = nn.Parameter(torch.rand(2, s))
        self.beta = nn.Parameter(torch.rand(2, s))
        self.o = nn.Linear(self.e, dims, bias=False)
        self.uv = nn.Linear(dims, 2 * self.e + s, bias=False)
        self.ln = ScaleNorm(dims)
        self.res_scale = Scale(dims)
        self.act_fn = nn.SiLU()
        self.sqrt_s = float(np.sqrt(s))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        uv = self.act_fn(self.uv(self.ln(inputs)))
        u, v, base = torch.split(uv, [self.e, self.e, self.s], dim=2)
        base = base.unsqueeze(2) * self.gamma[None, None, :] + self.beta
        q, k = torch.unbind(base, dim=2)
        kernel = torch.square(F.relu(torch.bmm(q, k.permute(0, 2, 1)) / self.sqrt_s))
        return self.res_scale(inputs) + self.o(u * torch.bmm(kernel, v))


class RTMCCHead(nn.Module):
    """7x7 conv to one map per keypoint, flattened; ScaleNorm + linear to tokens; GAU; x and y classifiers."""

    def __init__(self, in_channels: int, featuremap_hw: tuple[int, int], hidden: int = 256) -> None:
        super().__init__()
        w, h = INPUT_SIZE_WH
        flatten_dims = featuremap_hw[0] * featuremap_hw[1]
        self.final_layer = nn.Conv2d(in_channels, NUM_KEYPOINTS, 7, padding=3)
        self.mlp = nn.Sequential(ScaleNorm(flatten_dims), nn.Linear(flatten_dims, hidden, bias=False))
        self.gau = RTMCCBlock(NUM_KEYPOINTS, hidden)
        self.cls_x = nn.Linear(hidden, int(w * SIMCC_SPLIT_RATIO), bias=False)
        self.cls_y = nn.Linear(hidden, int(h * SIMCC_SPLIT_RATIO), bias=False)

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.gau(self.mlp(torch.flatten(self.final_layer(feats), 2)))
        return self.cls_x(tokens), self.cls_y(tokens)


class RTMPoseWholeBody(nn.Module):
    """mmpose TopdownPoseEstimator(CSPNeXt-P5, RTMCCHead): the state dict of `dw-ll_ucoco_384.pth`.

    Called on normalised RGB inputs [B, 3, 384, 288]; returns the SimCC logits
    (x [B, 133, 576], y [B, 133, 768]). `widen_factor` < 1 builds a narrower copy for tests.
    """

    def __init__(self, widen_factor: float = 1.0, deepen_factor: float = 1.0) -> None:
        super().__init__()
        w, h = INPUT_SIZE_WH
        self.backbone = CSPNeXt(widen_factor, deepen_factor)
        self.head = RTMCCHead(self.backbone.out_channels, (h // 32, w // 32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(self.backbone(x))


def load_landmarker(path: str | Path, device: str | torch.device = "cpu") -> RTMPoseWholeBody:
    """Build the DWPose model from an mmengine checkpoint (`state_dict` entry, else a bare state dict).

    The file's other entries (`meta`, `message_hub`, `ema_state_dict`, ...) are ignored and their
    library objects never imported; an optional `module.` prefix is stripped; the load is strict
    and a file that does not fit raises CheckpointError naming the missing and unexpected keys.
    """
    state_dict = clean_state_dict(read_checkpoint(path, ("state_dict",), inert_foreign_objects=True))
    model = RTMPoseWholeBody()
    load_strict(model, state_dict, source=str(path))
    return model.to(device).eval()


# -- preprocessing, flip test, decode -------------------------------------------------------------


def whole_frame_affine(height: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top-down affine for the whole frame as the person box: (centre, scale, 2x3 warp matrix).

    mmpose: bbox [0, 0, w, h] -> centre, scale = size x 1.25, widened to w/h = 288/384, then the
    matrix mapping the centre to the input's centre and the scale's width to the input's width
    (`get_warp_matrix`, computed from float32 points as upstream, rotation 0).
    """
    out_w, out_h = INPUT_SIZE_WH
    bbox = np.array([0, 0, width, height], dtype=np.float32)
    center = (bbox[:2] + bbox[2:]) * np.float32(0.5)
    scale = (bbox[2:] - bbox[:2]) * np.float32(BBOX_PADDING)
    aspect = np.float32(out_w / out_h)
    sw, sh = scale
    scale = np.array([sw, sw / aspect] if sw > sh * aspect else [sh * aspect, sh], dtype=np.float32)
    src = np.zeros((3, 2), dtype=np.float32)
    src[0] = center
    src[1] = center + np.array([0.0, scale[0] * -0.5])
    src[2] = src[1] + np.array([-(src[0] - src[1])[1], (src[0] - src[1])[0]])
    dst = np.zeros((3, 2), dtype=np.float32)
    dst[0] = [out_w * 0.5, out_h * 0.5]
    dst[1] = dst[0] + np.array([0.0, out_w * -0.5])
    dst[2] = dst[1] + np.array([-(dst[0] - dst[1])[1], (dst[0] - dst[1])[0]])
    return center, scale, cv2.getAffineTransform(src, dst)


def preprocess(frame_bgr: np.ndarray) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """Warp a BGR uint8 frame to the network input [1, 3, 384, 288] (RGB, normalised); also (centre, scale)."""
    if frame_bgr.ndim != 3 or frame_bgr.shape[2] != 3 or frame_bgr.dtype != np.uint8:
        raise ValueError(f"expected a BGR uint8 frame [H, W, 3], got {frame_bgr.dtype} {frame_bgr.shape}")
    center, scale, matrix = whole_frame_affine(*frame_bgr.shape[:2])
    warped = cv2.warpAffine(frame_bgr, matrix, INPUT_SIZE_WH, flags=cv2.INTER_LINEAR)
    rgb = torch.from_numpy(np.ascontiguousarray(warped[..., ::-1])).permute(2, 0, 1).float()
    mean = torch.tensor(MEAN_RGB, dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(STD_RGB, dtype=torch.float32).view(3, 1, 1)
    return ((rgb - mean) / std)[None], center, scale


def flip_simcc(simcc_x: torch.Tensor, simcc_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Map the SimCC vectors of a mirrored input back: keypoints swapped by FLIP_INDICES, x bins reversed."""
    index = list(FLIP_INDICES)
    return simcc_x[:, index].flip(-1), simcc_y[:, index]


@torch.no_grad()
def _flip_test(model: nn.Module, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The config's test: the mean of the SimCC vectors of the input and of its mirror (mapped back)."""
    simcc_x, simcc_y = model(x)
    flip_x, flip_y = flip_simcc(*model(x.flip(-1)))
    return ((simcc_x + flip_x) * 0.5).float().cpu().numpy(), ((simcc_y + flip_y) * 0.5).float().cpu().numpy()


def decode_simcc(simcc_x: np.ndarray, simcc_y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SimCC argmax decode ([..., K, 576], [..., K, 768]) -> keypoints [..., K, 2] in input pixels (float32), scores.

    mmpose's `get_simcc_maximum` + `SimCCLabel.decode` (no DARK): the first maximal bin, the score
    is the smaller of the two maxima, a keypoint whose score is not positive gets bin -1.
    """
    locs = np.stack((np.argmax(simcc_x, axis=-1), np.argmax(simcc_y, axis=-1)), axis=-1).astype(np.float32)
    scores = np.minimum(np.amax(simcc_x, axis=-1), np.amax(simcc_y, axis=-1))
    locs[scores <= 0.0] = -1
    return locs / np.float32(SIMCC_SPLIT_RATIO), scores


def input_to_frame(keypoints: np.ndarray, center: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Input pixels -> frame pixels: kp / input_size * scale + centre - scale / 2 (mmpose's inverse)."""
    return keypoints / np.array(INPUT_SIZE_WH) * scale + center - 0.5 * scale


def whole_body_keypoints_batch(model: nn.Module, frames_bgr: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """All 133 keypoints [N, 133, 2] in frame pixels (float64) and their scores [N, 133], one batch.

    Each frame as upstream's `inference_topdown` with no person box; frames may differ in size.
    """
    prepared = [preprocess(frame) for frame in frames_bgr]
    weight = next(model.parameters())  # the model's device and precision (fp16 on a GPU, fp64 in tests)
    x = torch.cat([p[0] for p in prepared]).to(device=weight.device, dtype=weight.dtype)
    keypoints, scores = decode_simcc(*_flip_test(model, x))
    centers = np.stack([p[1] for p in prepared])[:, None]
    scales = np.stack([p[2] for p in prepared])[:, None]
    return input_to_frame(keypoints, centers, scales), scores


def whole_body_keypoints(model: nn.Module, frame_bgr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All 133 keypoints [133, 2] in frame pixels (float64) and their scores [133] of one frame."""
    keypoints, scores = whole_body_keypoints_batch(model, [frame_bgr])
    return keypoints[0], scores[0]


def face_landmarks(model: nn.Module, frame_bgr: np.ndarray) -> np.ndarray:
    """The 68 face landmarks [68, 2] (x, y) in pixels of the full frame: keypoints 23-90 of the 133.

    The model always answers; whether the frame has a face (and an uncovered mouth) is the face
    detector's call, as upstream asks its face detector.
    """
    return whole_body_keypoints(model, frame_bgr)[0][FACE_KEYPOINTS]


def face_landmarks_batch(model: nn.Module, frames_bgr: Sequence[np.ndarray]) -> np.ndarray:
    """`face_landmarks` of several frames in one batch: [N, 68, 2]."""
    return whole_body_keypoints_batch(model, frames_bgr)[0][:, FACE_KEYPOINTS]


# -- the MuseTalk v1.5 box -------------------------------------------------------------------------


def musetalk_box(
    landmarks68: np.ndarray, frame_h: int, extra_margin: int = EXTRA_MARGIN, *, frame_w: int | None = None
) -> Box | None:
    """MuseTalk v1.5's face box from the 68 landmarks: (x1, y1, x2, y2), x2/y2 exclusive as crops slice.

    Upstream, on the landmarks truncated to int32: x1/x2 = min/max landmark x; the chin is the largest
    landmark y; y1 = max(0, lm29.y - (chin - lm29.y)), so landmark 29 (the lower nose bridge) is the
    box's vertical centre before the margin; y2 = min(chin + extra_margin, frame_h).

    Returns None where upstream judges the landmark box unusable (no height or width, or x1 < 0)
    and takes the face detector's box instead (`box_from_face_detection`). `frame_w`, when given,
    clips x2 to the frame as upstream's crop (a numpy slice) does.
    """
    lm = np.asarray(landmarks68)
    if lm.shape != (68, 2):
        raise ValueError(f"expected 68 landmarks [68, 2], got {lm.shape}")
    lm = lm.astype(np.int32)
    chin = int(lm[:, 1].max())
    nose_y = int(lm[NOSE_LANDMARK, 1])
    x1, x2 = int(lm[:, 0].min()), int(lm[:, 0].max())
    y1 = max(0, nose_y - (chin - nose_y))
    if chin - y1 <= 0 or x2 - x1 <= 0 or x1 < 0:
        return None
    if frame_w is not None:
        x2 = min(x2, frame_w)
    return (x1, y1, x2, min(chin + extra_margin, frame_h))


# Where the bundled Haar detector's box (services/lipsync/faces.py) has the two landmarks the MuseTalk box
# is built from, as fractions of the box's height: landmark 29 (lower nose bridge) 0.51 below its top,
# the chin 0.08 below its bottom (the box ends near the lower lip). Read off the sample avatar photo;
# the mean 68-point face agrees on the box's shape (chin - landmark 29 = 0.66 of the landmarks' width,
# here 0.62). An approximation for avatars without a landmark checkpoint, not upstream's box.
NOSE_BELOW_TOP = 0.51
CHIN_BELOW_BOTTOM = 0.08


def box_from_face_detection(face_box: Sequence[int], frame_h: int, extra_margin: int = EXTRA_MARGIN) -> Box | None:
    """A MuseTalk-like box from the face detector's box, for avatars prepared without a landmark checkpoint.

    The detector's raw box (`FaceDetector.detect`, before Wav2Lip's pads) stands in for the landmarks:
    its sides are the landmarks' x extent, landmark 29 and the chin are placed where they sit in the
    Haar box (`NOSE_BELOW_TOP`, `CHIN_BELOW_BOTTOM`), and MuseTalk's rule follows: y1 = max(0, lm29 -
    (chin - lm29)), y2 = min(chin + extra_margin, frame_h). So the crop keeps MuseTalk's proportions:
    its middle row, where the generator's masked half starts, at the lower nose. None for an empty box.
    """
    x1, y1, x2, y2 = (int(v) for v in face_box)
    if x2 <= x1 or y2 <= y1:
        return None
    height = y2 - y1
    nose = y1 + round(NOSE_BELOW_TOP * height)
    chin = y2 + round(CHIN_BELOW_BOTTOM * height)
    return (max(0, x1), max(0, nose - (chin - nose)), x2, min(chin + extra_margin, frame_h))
