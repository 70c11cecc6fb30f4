"""Real-ESRGAN pre/post-processing and the upscaler objects the pipeline calls.

Mirrors `RealESRGANer.enhance` (xinntao/Real-ESRGAN @a4abfb2, realesrgan/utils.py) for batches of
uint8 BGR face crops: BGR->RGB, /255, reflect pad to a multiple of 2 (scale 2) or 4 (scale 1) on the
right/bottom, model, crop, clamp [0, 1], RGB->BGR, *255, round, then a LANCZOS4 resize when the
requested paste size is not the network's output size. Not copied: the optional pre-pad (CLI
default 0), tiling (face crops are small) and the 16-bit input branch (crops are always uint8).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from services.superres.models import SR_MODELS, create_sr_model

_LOGGER = logging.getLogger(__name__)

Size = tuple[int, int]  # (width, height), cv2 order


# ---------------------------------------------------------------------------------------------------
# Pre/post-processing
# ---------------------------------------------------------------------------------------------------


def _check_crops(crops: np.ndarray) -> np.ndarray:
    if not isinstance(crops, np.ndarray) or crops.dtype != np.uint8 or crops.ndim != 4 or crops.shape[-1] != 3:
        shape = getattr(crops, "shape", None)
        dtype = getattr(crops, "dtype", type(crops).__name__)
        raise ValueError(f"crops must be a uint8 array of shape (B, H, W, 3), got {dtype} {shape}")
    return crops


def to_model_input(
    crops_bgr: np.ndarray, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """uint8 BGR crops -> the network's input.

    Args:
        crops_bgr: (B, H, W, 3) uint8, BGR.
        device: where the tensor should live.
        dtype: the model's dtype.

    Returns:
        (B, 3, H, W) RGB in [0, 1] on `device`, of `dtype`.
    """
    crops_bgr = _check_crops(crops_bgr)
    # Move uint8 (4x fewer bytes than float) and do the maths on the device.
    t = torch.from_numpy(np.ascontiguousarray(crops_bgr)).to(device)
    t = t.flip(-1).permute(0, 3, 1, 2)  # BGR->RGB, NHWC->NCHW
    # Divide in float32 like upstream, then cast (upstream also halves only after /255).
    return (t.to(torch.float32) / 255.0).to(dtype).contiguous()


def pad_multiple(scale: int) -> int:
    """Input side multiple the network needs: 2 for scale 2, 4 for scale 1 (pixel unshuffle), else 1."""
    return {2: 2, 1: 4}.get(scale, 1)


def reflect_pad(x: torch.Tensor, multiple: int) -> tuple[torch.Tensor, int, int]:
    """Reflect-pad the right/bottom of (B, C, H, W) so H and W are multiples of `multiple`.

    Returns:
        The padded tensor, the rows added and the columns added.
    """
    h, w = x.shape[-2:]
    pad_h, pad_w = -h % multiple, -w % multiple
    if pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h), mode="reflect")
    return x, pad_h, pad_w


def from_model_output(t: torch.Tensor) -> np.ndarray:
    """The network's output -> uint8 BGR images.

    Args:
        t: (B, 3, H*s, W*s) RGB, nominally in [0, 1] (any float dtype, any device).

    Returns:
        (B, H*s, W*s, 3) uint8 BGR.
    """
    # float32 before clamp/round as upstream does (`.float()`), so fp16 models round the same way.
    t = t.float().clamp(0, 1).flip(1).permute(0, 2, 3, 1)  # RGB->BGR, NCHW->NHWC
    # Round (half to even, as numpy) on the device, copy back uint8.
    return (t * 255.0).round().to(torch.uint8).cpu().numpy()


def _per_item_sizes(out_size: Size | Sequence[Size], batch: int) -> list[Size]:
    """Normalize `out_size` (one (w, h) for all, or one per item) to a list of `batch` sizes."""
    if len(out_size) == 2 and all(isinstance(v, (int, np.integer)) for v in out_size):
        w, h = cast(Size, out_size)  # one (w, h): checked just above
        sizes = [(int(w), int(h))] * batch
    else:
        sizes = [(int(w), int(h)) for w, h in cast(Sequence[Size], out_size)]
    if len(sizes) != batch:
        raise ValueError(f"got {len(sizes)} output sizes for a batch of {batch}")
    if any(w <= 0 or h <= 0 for w, h in sizes):
        raise ValueError(f"output sizes must be positive, got {sizes}")
    return sizes


def _resize_lanczos(img: np.ndarray, size: Size) -> np.ndarray:
    """Resize (H, W, 3) to `size` (w, h) with LANCZOS4 (RealESRGANer's choice); no-op when equal."""
    w, h = size
    if img.shape[:2] == (h, w):
        return img
    return cv2.resize(img, (w, h), interpolation=cv2.INTER_LANCZOS4)


# ---------------------------------------------------------------------------------------------------
# Upscalers
# ---------------------------------------------------------------------------------------------------


class ModelUpscaler:
    """A Real-ESRGAN network plus its pre/post-processing, one forward per batch.

    Args:
        model: an SR network mapping (B, 3, H, W) -> (B, 3, H*scale, W*scale).
        scale: the network's scale factor.
        device: where the model runs.
        dtype: the model's dtype (float16 on CUDA halves memory and matches the upstream CLI).
        model_name: the name reported in logs and metrics.
    """

    def __init__(
        self,
        model: nn.Module,
        scale: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        model_name: str = "custom",
    ) -> None:
        self.device = torch.device(device)
        self.dtype = dtype
        self.scale = scale
        self.model_name = model_name
        self.model = model.to(device=self.device, dtype=dtype).eval()

    def upscale(self, crops: np.ndarray, out_size: Size | Sequence[Size]) -> list[np.ndarray]:
        """Upscale a batch of same-size crops and resize each to its paste size.

        Args:
            crops: (B, h, w, 3) uint8 BGR.
            out_size: (width, height) for every item, or a list of B such pairs.

        Returns:
            B uint8 BGR arrays, item i of shape (height_i, width_i, 3).
        """
        crops = _check_crops(crops)
        sizes = _per_item_sizes(out_size, len(crops))
        if len(crops) == 0:
            return []
        h, w = crops.shape[1:3]
        with torch.inference_mode():
            x, _, _ = reflect_pad(to_model_input(crops, self.device, self.dtype), pad_multiple(self.scale))
            # Crop the padding back off: it sits on the right/bottom, scaled by the network.
            y = self.model(x)[:, :, : h * self.scale, : w * self.scale]
            images = from_model_output(y)
        return [_resize_lanczos(img, size) for img, size in zip(images, sizes)]

    def warmup(self, batch_size: int = 1, size: Size = (96, 96)) -> None:
        """Run one dummy batch so kernels/allocations are ready before the first request."""
        w, h = size
        self.upscale(np.zeros((batch_size, h, w, 3), np.uint8), (w * self.scale, h * self.scale))


class LanczosUpscaler:
    """Weight-free fallback: a plain LANCZOS4 resize straight to the paste size."""

    model_name = "lanczos"

    def upscale(self, crops: np.ndarray, out_size: Size | Sequence[Size]) -> list[np.ndarray]:
        """Same contract as `ModelUpscaler.upscale`."""
        crops = _check_crops(crops)
        sizes = _per_item_sizes(out_size, len(crops))
        return [_resize_lanczos(img, size) for img, size in zip(crops, sizes)]

    def warmup(self, batch_size: int = 1, size: Size = (96, 96)) -> None:
        """One dummy resize (keeps the interface uniform; there is nothing to load)."""
        w, h = size
        self.upscale(np.zeros((batch_size, h, w, 3), np.uint8), (w * 2, h * 2))


def create_upscaler(
    model_name: str | None,
    checkpoint: str | None,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
) -> ModelUpscaler | LanczosUpscaler:
    """Build the configured upscaler.

    Args:
        model_name: a key of `SR_MODELS`, "lanczos", or None.
        checkpoint: the weights file; None selects the weight-free Lanczos fallback.
        device: "cpu", "cuda", "cuda:1", ...
        dtype: model dtype; default float16 on CUDA (as the upstream CLI) and float32 elsewhere.

    Raises:
        ValueError: a checkpoint without a known model name.
        CheckpointError: the checkpoint does not fit the model.
    """
    if model_name == "lanczos":
        _LOGGER.info("super-resolution: lanczos resize selected")
        return LanczosUpscaler()
    if checkpoint is None:
        _LOGGER.warning(
            "super-resolution: no checkpoint configured (model %r); using the weight-free LANCZOS4 fallback",
            model_name,
        )
        return LanczosUpscaler()
    if model_name is None:
        raise ValueError(f"a super-resolution checkpoint needs a model name; known: {', '.join(SR_MODELS)}")
    model = create_sr_model(model_name, checkpoint)  # raises ValueError for an unknown name
    if dtype is None:
        dtype = torch.float16 if torch.device(device).type == "cuda" else torch.float32
    _LOGGER.info("super-resolution: %s from %s on %s (%s)", model_name, checkpoint, device, dtype)
    return ModelUpscaler(model, SR_MODELS[model_name]["scale"], device, dtype, model_name=model_name)
