"""Procedural lip sync: silence is a no-op, loudness opens the mouth, items are independent."""

from __future__ import annotations

import numpy as np
import torch

from services.lipsync.prep import model_inputs
from services.lipsync.procedural import ProceduralLipSync


def _faces(batch: int) -> torch.Tensor:
    # A textured face-like image, so any warp shows up as a pixel change.
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)
    return torch.from_numpy(model_inputs(np.stack([img] * batch)))


def _audio(levels: list[float]) -> torch.Tensor:
    return torch.tensor(levels, dtype=torch.float32).view(-1, 1, 1, 1).expand(-1, 1, 80, 16).contiguous()


def test_silence_returns_reference_face() -> None:
    faces = _faces(2)
    out = ProceduralLipSync()(_audio([-4.0, -4.0]), faces)
    assert out.shape == (2, 3, 96, 96)
    assert torch.equal(out, faces[:, 3:6])


def test_loud_changes_lower_face_only() -> None:
    faces = _faces(1)
    out = ProceduralLipSync()(_audio([2.0]), faces)
    ref = faces[:, 3:6]
    assert torch.equal(out[:, :, :40], ref[:, :, :40])
    assert (out[:, :, 48:] - ref[:, :, 48:]).abs().mean() > 0.01
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    assert ProceduralLipSync.model_name == "procedural"


def test_louder_means_more_change() -> None:
    levels = [-4.0, -2.2, -1.8, -1.4, -1.0, -0.6, 0.0]
    faces = _faces(len(levels))
    out = ProceduralLipSync()(_audio(levels), faces)
    change = (out - faces[:, 3:6]).abs().sum(dim=(1, 2, 3)).tolist()
    assert change[0] == 0.0
    assert all(a < b for a, b in zip(change[:-1], change[1:-1]))  # strictly increasing until fully open
    assert change[-1] >= change[-2]


def test_batch_items_are_independent() -> None:
    levels = [-4.0, 0.0, -1.5, -4.0]
    faces = _faces(len(levels))
    model = ProceduralLipSync()
    batched = model(_audio(levels), faces)
    for i, level in enumerate(levels):
        single = model(_audio([level]), faces[i:i + 1])
        assert torch.allclose(batched[i:i + 1], single, atol=1e-6)
    assert torch.equal(batched[0], faces[0, 3:6]) and torch.equal(batched[3], faces[3, 3:6])


def test_deterministic() -> None:
    faces = _faces(2)
    audio = _audio([-1.0, 0.5])
    assert torch.equal(ProceduralLipSync()(audio, faces), ProceduralLipSync()(audio, faces))
