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
        single = model(_audio([level]), faces[i : i + 1])
        assert torch.allclose(batched[i : i + 1], single, atol=1e-6)
    assert torch.equal(batched[0], faces[0, 3:6]) and torch.equal(batched[3], faces[3, 3:6])


def test_deterministic() -> None:
    faces = _faces(2)
    audio = _audio([-1.0, 0.5])
    assert torch.equal(ProceduralLipSync()(audio, faces), ProceduralLipSync()(audio, faces))


def test_speech_envelope_drives_the_opening() -> None:
    # The clip's envelope wins over the window's own loudness; NaN (no envelope sent) falls back to it.
    faces = _faces(3)
    model = ProceduralLipSync()
    loud = _audio([0.0, 0.0, 0.0])
    out = model(loud, faces, torch.tensor([0.0, float("nan"), 1.0]))
    assert torch.equal(out[0], faces[0, 3:6])  # envelope 0: shut, despite the loud window
    assert torch.allclose(out[1], model(loud[1:2], faces[1:2])[0])  # NaN: the window's loudness
    assert torch.allclose(out[2], model(_audio([2.0]), faces[2:3])[0])  # envelope 1: fully open


def _sample_crop() -> np.ndarray:
    import cv2

    from services.lipsync.faces import HaarFaceDetector, prepare_boxes
    from services.local.cluster import REPO_ROOT
    from services.media.crops import crop_and_resize

    image = cv2.imread(str(REPO_ROOT / "samples" / "avatar.jpg"))
    (box,) = prepare_boxes(HaarFaceDetector().detect([image]), *image.shape[:2])
    return crop_and_resize(image, box)


def test_lip_line_is_found_in_the_crop() -> None:
    # The sample face's lips meet at rows 63-65 of its 96 px crop (the dark row between the teeth and
    # the lower lip); its nostrils (rows 54-55) and chin are not taken for it.
    crop = _sample_crop()
    faces = torch.from_numpy(model_inputs(crop[None]))
    assert 62 <= int(ProceduralLipSync.lip_line(faces[:, 3:6]).item()) <= 66


def test_lip_line_follows_a_drawn_mouth() -> None:
    # A flat face with a dark lip gap drawn at row 60 or 68, and a broad dark beard below 74.
    rows = []
    for gap in (60, 68):
        img = np.full((96, 96, 3), 180, np.uint8)
        img[74:, 20:76] = 60
        img[gap : gap + 2, 30:66] = 40
        rows.append(int(ProceduralLipSync.lip_line(torch.from_numpy(model_inputs(img[None]))[:, 3:6]).item()))
    assert rows[0] in (60, 61) and rows[1] in (68, 69), rows
