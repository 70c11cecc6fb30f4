"""Face boxes and the 96x96 reference crops the lip-sync model takes: numpy and OpenCV only.

Shared by the lipsync stage and the gateway (which cuts each avatar's crops once at CreateAvatar and
must not import torch).
"""

from __future__ import annotations

import cv2
import numpy as np

Box = tuple[int, int, int, int]  # x1, y1, x2, y2 (x2/y2 exclusive)
IMG_SIZE = 96  # Wav2Lip's face size


def crop_and_resize(frame: np.ndarray, box: Box, size: int = IMG_SIZE) -> np.ndarray:
    """`frame[y1:y2, x1:x2]` resized to (size, size) with INTER_LINEAR (upstream's cv2 default)."""
    x1, y1, x2, y2 = box
    face = frame[y1:y2, x1:x2]
    if face.size == 0:
        raise ValueError(f"empty face crop for box {box} in a frame of shape {frame.shape}")
    return cv2.resize(face, (size, size), interpolation=cv2.INTER_LINEAR)
