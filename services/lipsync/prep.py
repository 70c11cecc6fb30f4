"""Wav2Lip input/output tensors, exactly as upstream inference.py builds and reads them.

Colour stays BGR throughout (the model was trained on OpenCV BGR); faces are scaled to [0, 1]
with no mean/std normalisation; predictions are converted back with truncation, not rounding.
"""

from __future__ import annotations

import cv2
import numpy as np
import torch

from services.media.crops import IMG_SIZE, crop_and_resize

__all__ = [
    "IMG_SIZE",
    "crop_and_resize",
    "model_inputs",
    "model_inputs_torch",
    "mel_inputs",
    "to_uint8_faces",
    "resize_to",
]


def model_inputs(faces: np.ndarray) -> np.ndarray:
    """(B, S, S, 3) uint8 BGR faces -> (B, 6, S, S) float32: [lower-half-masked face, face] / 255.

    The mask zeroes rows S//2.. so the model must regenerate the mouth region; the unmasked copy
    is the identity/pose reference (at inference it is the same frame).
    """
    size = faces.shape[1]
    masked = faces.copy()
    masked[:, size // 2 :] = 0
    # float32 division by 255 is exactly what upstream's float64 divide-then-cast yields for 0..255.
    batch = np.concatenate((masked, faces), axis=3).astype(np.float32) / np.float32(255.0)
    return np.ascontiguousarray(batch.transpose(0, 3, 1, 2))


def model_inputs_torch(faces_uint8: torch.Tensor) -> torch.Tensor:
    """`model_inputs` for a (B, S, S, 3) uint8 tensor already on the target device."""
    size = faces_uint8.shape[1]
    faces = faces_uint8.permute(0, 3, 1, 2).to(torch.float32) / 255.0
    masked = faces.clone()
    masked[:, :, size // 2 :] = 0
    return torch.cat((masked, faces), dim=1).contiguous()


def mel_inputs(windows: np.ndarray) -> np.ndarray:
    """(B, 80, 16) mel windows -> (B, 1, 80, 16) float32."""
    windows = np.asarray(windows, dtype=np.float32)
    return np.ascontiguousarray(windows[:, None])


def to_uint8_faces(pred: np.ndarray) -> np.ndarray:
    """(B, 3, S, S) float predictions in [0, 1] -> (B, S, S, 3) uint8, truncating like upstream.

    The clip is a no-op for sigmoid outputs; it only keeps an out-of-range value from wrapping.
    """
    scaled = np.asarray(pred, dtype=np.float32).transpose(0, 2, 3, 1) * np.float32(255.0)
    return np.clip(scaled, 0, 255).astype(np.uint8)


def resize_to(face: np.ndarray, width: int, height: int) -> np.ndarray:
    """Resize a generated face back to its box size (INTER_LINEAR, as upstream before pasting)."""
    return cv2.resize(face, (width, height), interpolation=cv2.INTER_LINEAR)
