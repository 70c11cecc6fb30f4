"""Wav2Lip tensors: mask rows, channel layout, BGR order, truncation on the way back."""

from __future__ import annotations

import numpy as np
import torch

from services.lipsync.prep import (
    crop_and_resize,
    mel_inputs,
    model_inputs,
    model_inputs_torch,
    resize_to,
    to_uint8_faces,
)


def _faces(batch: int = 3) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (batch, 96, 96, 3), dtype=np.uint8)


def test_model_inputs_mask_and_channels() -> None:
    faces = _faces()
    x = model_inputs(faces)
    assert x.shape == (3, 6, 96, 96) and x.dtype == np.float32
    assert np.all(x[:, 0:3, 48:] == 0)
    assert np.array_equal(x[:, 0:3, :48], x[:, 3:6, :48])
    # channel c of each half is BGR channel c of the input (no RGB conversion), scaled like upstream
    upstream = (faces.astype(np.float64) / 255.0).astype(np.float32).transpose(0, 3, 1, 2)
    assert np.array_equal(x[:, 3:6], upstream)
    assert np.array_equal(x[:, 0, :48], upstream[:, 0, :48])


def test_model_inputs_torch_agrees() -> None:
    faces = _faces()
    assert torch.equal(model_inputs_torch(torch.from_numpy(faces)), torch.from_numpy(model_inputs(faces)))


def test_mel_inputs() -> None:
    windows = np.random.default_rng(1).standard_normal((4, 80, 16))
    x = mel_inputs(windows)
    assert x.shape == (4, 1, 80, 16) and x.dtype == np.float32
    assert np.array_equal(x[:, 0], windows.astype(np.float32))


def test_to_uint8_truncates() -> None:
    pred = np.zeros((1, 3, 96, 96), dtype=np.float32)
    pred[0, 0, 0, 0] = 0.999  # 254.745 -> 254 (rounding would give 255)
    pred[0, 1, 0, 0] = 1.0
    pred[0, 2, 5, 7] = 0.5  # 127.5 -> 127
    out = to_uint8_faces(pred)
    assert out.shape == (1, 96, 96, 3) and out.dtype == np.uint8
    assert out[0, 0, 0].tolist() == [254, 255, 0]
    assert out[0, 5, 7].tolist() == [0, 0, 127]


def test_crop_and_resize_and_back() -> None:
    frame = np.zeros((200, 300, 3), dtype=np.uint8)
    frame[50:150, 100:180] = (10, 20, 30)
    face = crop_and_resize(frame, (100, 50, 180, 150))
    assert face.shape == (96, 96, 3) and face.dtype == np.uint8
    assert np.all(face == (10, 20, 30))
    assert resize_to(face, 80, 100).shape == (100, 80, 3)
