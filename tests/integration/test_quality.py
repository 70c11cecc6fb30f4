"""Output quality, measured on real renders through a LocalCluster (procedural model, Lanczos).

One template video, 48 frames of the sample face panning 1 px per frame across a larger canvas
(so every frame differs from the next by about the same amount), and 5 s of speech: the template
is shorter than the audio, so the output loops through it twice and more. Measured on the output:

* the upper face (above the rows the lip-sync model regenerates) keeps the template's fine detail:
  Laplacian variance ratio against the template within 10 % of the codec floor (the template
  re-encoded alone, with the writer and crf the workers use);
* the loop turns: no frame-to-frame change larger than 3x the median (ping-pong, the default);
* the colour tags: BT.601 matrix (smpte170m), limited (tv) range, as the I420 conversion is;
  BT.709 primaries and transfer;
* the face boxes CreateAvatar stored follow the pan (slope -1 px/frame) without shaking around it
  (second-difference RMS of the box centre below 0.3 px).

`measure` prints the numbers (docs/quality.md has them, before and after).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from services.media.timeline import LOOP_PING_PONG, loop_frame
from services.media.video_format import COLOR_TAGS
from tests.integration.util import SAMPLES, codec_floor, render_template, write_template

FPS = 25
FRAMES = 48  # the template: 1.92 s, the audio 5 s
SIZE = 320  # output frame (square)
CANVAS = SIZE + FRAMES
AUDIO_S = 5.0
CRF = 20  # the workers' default


def template_frames() -> list[np.ndarray]:
    """The sample face on a textured canvas, a SIZE x SIZE window panning 1 px per frame."""
    face = cv2.resize(cv2.imread(str(SAMPLES / "avatar.jpg")), (SIZE - 40, SIZE - 40), interpolation=cv2.INTER_AREA)
    rng = np.random.default_rng(7)
    canvas = cv2.GaussianBlur(rng.integers(40, 215, (CANVAS, CANVAS + FRAMES, 3), dtype=np.uint8), (0, 0), 2.0)
    canvas[20 : 20 + face.shape[0], FRAMES // 2 + 20 : FRAMES // 2 + 20 + face.shape[1]] = face
    return [np.ascontiguousarray(canvas[:SIZE, i : i + SIZE]) for i in range(FRAMES)]


def luma(path: Path) -> np.ndarray:
    """The Y planes of every frame of a video: (frames, H, W) uint8, as coded (no conversion)."""
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="yuv420p")[:SIZE] for f in container.decode(video=0)])


def laplacian_variance(y: np.ndarray) -> float:
    return float(cv2.Laplacian(y.astype(np.float32), cv2.CV_32F, ksize=3).var())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Renders the template once with the default options; yields paths and the avatar's boxes."""
    folder = tmp_path_factory.mktemp("quality")
    source = folder / "template.mp4"
    write_template(source, template_frames(), FPS)
    done, output, boxes, _ = render_template(folder, source, AUDIO_S, CRF, "panning")
    assert len(boxes) == FRAMES
    yield {"source": source, "output": output, "boxes": boxes, "folder": folder, "frames": done.total_frames}


def measure(rendered: dict) -> dict:
    """The numbers the tests check (printed with -s)."""
    folder: Path = rendered["folder"]
    template = luma(rendered["source"])  # what the avatar decodes (up to the I420 round trip)
    floor_path = folder / "floor.mp4"
    codec_floor(rendered["source"], floor_path, CRF)
    floor = luma(floor_path)
    output = luma(rendered["output"])
    assert len(output) == rendered["frames"]

    # The template frame each output frame shows: the one whose background band (the top rows,
    # no face there) is nearest (the pan makes every frame's band different).
    band = np.s_[:, :16, :]
    distances = np.abs(output[band][:, None].astype(np.int16) - template[band][None].astype(np.int16)).mean(axis=(2, 3))
    mapping = [int(k) for k in distances.argmin(axis=1)]
    ratios_out, ratios_floor, lower_diffs = [], [], []
    for i, y in enumerate(output):
        f = mapping[i]
        box = rendered["boxes"][f]
        if box is None:
            continue
        x1, y1, x2, y2 = box
        upper = (slice(y1 + 2, y1 + (y2 - y1) // 2 - 2), slice(x1 + 2, x2 - 2))
        reference = laplacian_variance(template[f][upper])
        ratios_out.append(laplacian_variance(y[upper]) / reference)
        ratios_floor.append(laplacian_variance(floor[f][upper]) / reference)
        lower = (slice(y1 + (y2 - y1) * 5 // 8, y2 - 2), slice(x1 + 2, x2 - 2))  # the mouth's rows
        lower_diffs.append(float(np.abs(y[lower].astype(np.int16) - floor[f][lower]).mean()))
    changes = np.abs(np.diff(output.astype(np.int16), axis=0)).mean(axis=(1, 2))
    result = {
        "upper_face_laplacian_ratio": float(np.mean(ratios_out)),
        "codec_floor_laplacian_ratio": float(np.mean(ratios_floor)),
        "median_change": float(np.median(changes)),
        "max_change": float(changes.max()),
        "max_change_at": int(changes.argmax()) + 1,
        "faces": len(ratios_out),
        "lower_face_max_diff": max(lower_diffs),
        "mapping": mapping,
    }
    print("quality:", json.dumps(result))
    return result


def test_upper_face_keeps_the_templates_detail(rendered: dict) -> None:
    m = measure(rendered)
    assert m["faces"] > len(luma(rendered["output"])) // 2
    assert m["upper_face_laplacian_ratio"] >= 0.9 * m["codec_floor_laplacian_ratio"], m
    assert m["lower_face_max_diff"] > 2.0, m  # the generated mouth is pasted (the test sees a paste)


def test_loop_turns_without_a_jump(rendered: dict) -> None:
    m = measure(rendered)
    assert m["median_change"] > 0.3, m  # the template does move: the test could see a jump
    assert m["max_change"] <= 3 * m["median_change"], m
    # Every segment (1 s each) mapped its frames the same way: forward and back through the template.
    assert m["mapping"] == [loop_frame(i, FRAMES, LOOP_PING_PONG) for i in range(rendered["frames"])]


def test_colour_tags_match_the_conversion(rendered: dict) -> None:
    with av.open(str(rendered["output"])) as container:
        stream = container.streams.video[0]
        context = stream.codec_context
        frame = next(container.decode(stream))
    # BT.601 matrix (smpte170m), limited range: what cv2.COLOR_BGR2YUV_I420 produces; BT.709
    # primaries and transfer (docs/quality.md). In the container (colr) and in the stream (VUI).
    assert (
        {name: getattr(context, name) for name in COLOR_TAGS}
        == COLOR_TAGS
        == {"colorspace": 6, "color_range": 1, "color_primaries": 1, "color_trc": 1}
    )
    assert {name: getattr(frame, name) for name in COLOR_TAGS} == COLOR_TAGS


def test_boxes_are_steady_and_follow_the_pan(rendered: dict) -> None:
    # The window pans 1 px per frame, so the face moves 1 px per frame to the left: a straight line.
    # The boxes CreateAvatar stored (Haar detections, then steady_boxes) must not shake around it
    # (issue 10: 0.77 px second-difference RMS before smoothing) and must not lag it.
    boxes = np.array([b for b in rendered["boxes"] if b is not None], dtype=np.float64)
    assert len(boxes) == FRAMES
    centres = np.stack([(boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2], axis=1)
    second = np.diff(centres, n=2, axis=0)
    rms = float(np.sqrt(np.mean(np.sum(second**2, axis=1))))
    frames = np.arange(FRAMES)
    slope, intercept = np.polyfit(frames, centres[:, 0], 1)
    worst = float(np.abs(centres[:, 0] - (slope * frames + intercept)).max())
    print("boxes:", json.dumps({"second_difference_rms": rms, "slope": slope, "worst_off_line": worst}))
    assert rms < 0.3, rms
    assert abs(slope + 1.0) < 0.05, slope  # follows the pan
    assert worst < 1.5, worst
