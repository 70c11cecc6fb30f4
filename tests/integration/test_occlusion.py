"""Covered mouths pass through: a real render through a LocalCluster (procedural model, Lanczos; the
musetalk tier's stand-in), once per tier.

The template: 30 frames of the sample face panning 1 px per frame, with a skin-coloured hand over
the mouth and chin in frames 10-15. Avatar preparation finds the face in every frame (the Haar cascade
keys on the eyes) and flags the hand frames as covered (the Wav2Lip tier's DetectFaces
`mouth_covered`, the musetalk tier's PrepareAvatar last answer: the same check), so the avatar counts
fewer faces and the render workers pass those frames through: those output frames equal the template
re-encoded alone (the codec floor), while the other frames get the generated mouth. 2 s of speech: the
ping-pong loop shows the hand frames twice (on the way forward and on the way back).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest

from services.media.timeline import LOOP_PING_PONG, loop_frame
from tests.helpers.occluders import SAMPLE_FACE, panning_clip
from tests.integration.util import codec_floor, render_template, write_template

FPS = 25
FRAMES = 30
SIZE = 256
COVERED = range(10, 16)
AUDIO_S = 2.0
CRF = 20  # the workers' default
FACE = SAMPLE_FACE  # the sample's Haar box (x1, y1, x2, y2) in avatar.jpg


def luma(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="yuv420p")[:SIZE] for f in container.decode(video=0)])


@pytest.fixture(scope="module", params=["wav2lip", "musetalk"])
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    folder = tmp_path_factory.mktemp("occlusion")
    source = folder / "template.mp4"
    write_template(source, panning_clip(FRAMES, COVERED, SIZE), FPS)
    floor = codec_floor(source, folder / "floor.mp4", CRF)  # what the workers' encoder could at best give
    _, output, boxes, avatar = render_template(folder, source, AUDIO_S, CRF, "hand", request.param)
    assert avatar.model == request.param
    yield {
        "template": luma(source),
        "floor": luma(floor),
        "output": luma(output),
        "boxes": boxes,
        "faces": avatar.faces_found,
    }


def measure(rendered: dict) -> dict:
    """Per output frame: mean |Y difference| in the mouth's rows against the template, and the floor's."""
    template, floor, output, boxes = rendered["template"], rendered["floor"], rendered["output"], rendered["boxes"]
    mouth = (slice(FACE[1] + 60, FACE[3] + 10), slice(60, 160))  # the hand and the mouth in every frame
    out_diff, floor_diff = [], []
    for i, y in enumerate(output):
        f = loop_frame(i, FRAMES, LOOP_PING_PONG)
        out_diff.append(float(np.abs(y[mouth].astype(np.int16) - template[f][mouth]).mean()))
        floor_diff.append(float(np.abs(floor[f][mouth].astype(np.int16) - template[f][mouth]).mean()))
    passed = [b is None for b in boxes]
    result = {
        "flagged": [i for i, p in enumerate(passed) if p],
        "frames": len(output),
        "out_diff": [round(d, 2) for d in out_diff],
        "floor_diff": [round(d, 2) for d in floor_diff],
    }
    print("occlusion:", json.dumps(result))
    return result


def test_covered_frames_pass_through_and_the_rest_is_rendered(rendered: dict) -> None:
    m = measure(rendered)
    assert m["frames"] == round(AUDIO_S * FPS)
    # Every hand frame is flagged (with a frame or two of margin), nothing far from the hand is.
    assert set(COVERED) <= set(m["flagged"]) <= set(range(COVERED.start - 3, COVERED.stop + 3)), m["flagged"]
    assert rendered["faces"] == FRAMES - len(m["flagged"])  # the avatar counts the covered frames out
    shown = [(i, loop_frame(i, FRAMES, LOOP_PING_PONG)) for i in range(m["frames"])]
    covered = [i for i, f in shown if f in COVERED]
    assert len(covered) >= 2 * len(COVERED) - 2  # forward and back
    for i in covered:  # the template as it was, up to the codec
        assert m["out_diff"][i] <= 1.5 * m["floor_diff"][i] + 0.5, (i, m)
    rendered_frames = [i for i, f in shown if f not in m["flagged"]]
    painted = [i for i in rendered_frames if m["out_diff"][i] > 2 * m["floor_diff"][i] + 1.0]
    assert len(painted) >= len(rendered_frames) // 2, m  # the others do get a mouth
