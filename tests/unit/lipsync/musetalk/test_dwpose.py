"""DWPose landmarks for the MuseTalk tier: the public key table, checkpoint loading, numerics against an
independent functional computation, the affine, the SimCC decode, and the face-box rules."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from services.inference.checkpoints import seeded_state_dict
from services.lipsync.faces import HaarFaceDetector
from services.lipsync.musetalk.dwpose import (
    FLIP_INDICES,
    RTMPoseWholeBody,
    box_from_face_detection,
    decode_simcc,
    face_landmarks,
    face_landmarks_batch,
    flip_simcc,
    input_to_frame,
    load_landmarker,
    musetalk_box,
    preprocess,
    whole_body_keypoints,
    whole_frame_affine,
)
from services.serving.errors import CheckpointError

TABLE = json.loads((Path(__file__).parent / "data" / "keys_dwpose.json").read_text())
CONFIG = TABLE["config"]


def _seeded_weights(model: RTMPoseWholeBody) -> dict[str, torch.Tensor]:
    """The project's seeded weights, rescaled so that a signal crosses the 30-odd layers.

    At the seeded rule's scale (0.02) the backbone's output no longer depends on its input and the
    flip-averaged logits tie; He-like weights (gain 1.5 / sqrt(fan_in)), unit ScaleNorm gains and a
    unit residual scale keep the output input-dependent, with distinct peaks.
    """
    sd = seeded_state_dict(model)
    for key, value in sd.items():
        if value.ndim >= 2 and key not in ("head.gau.gamma", "head.gau.beta"):
            sd[key] = value / 0.02 * 1.5 / value[0].numel() ** 0.5
    sd["head.mlp.0.g"] = sd["head.gau.ln.g"] = torch.ones(1)
    sd["head.gau.res_scale.scale"] = 1 + sd["head.gau.res_scale.scale"]
    sd["head.gau.gamma"] = sd["head.gau.gamma"] / 0.02
    sd["head.gau.beta"] = sd["head.gau.beta"] / 0.2
    return sd


def _seeded_model(**size: float) -> tuple[RTMPoseWholeBody, dict[str, torch.Tensor]]:
    model = RTMPoseWholeBody(**size)
    sd = _seeded_weights(model)
    model.load_state_dict(sd)
    return model.eval(), sd


@pytest.fixture(scope="module")
def seeded() -> tuple[RTMPoseWholeBody, dict[str, torch.Tensor]]:
    """The full-size model (33.6 M parameters)."""
    return _seeded_model()


@pytest.fixture(scope="module")
def narrow() -> tuple[RTMPoseWholeBody, dict[str, torch.Tensor]]:
    """A quarter of the channels and a third of the blocks, for the tests that run the pipeline."""
    return _seeded_model(widen_factor=0.25, deepen_factor=1 / 3)


def _frame(height: int = 240, width: int = 320) -> np.ndarray:
    gen = np.random.default_rng(3)
    frame = cv2.GaussianBlur(gen.integers(0, 256, (height, width, 3), dtype=np.uint8), (7, 7), 0)
    cv2.circle(frame, (width // 2, height // 2), min(height, width) // 4, (40, 90, 200), -1)
    return frame


def _rel(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max() / b.abs().max())


# -- an independent computation: the network written as functions of the state dict ----------------


def _conv_bn_silu(sd: dict[str, torch.Tensor], name: str, x: torch.Tensor, stride: int = 1, groups: int = 1):
    w = sd[f"{name}.conv.weight"]
    x = F.conv2d(x, w, None, stride, w.shape[-1] // 2, 1, groups)
    bn = {k: sd[f"{name}.bn.{k}"] for k in ("weight", "bias", "running_mean", "running_var")}
    x = (x - bn["running_mean"][:, None, None]) / torch.sqrt(bn["running_var"][:, None, None] + 1e-5)
    return F.silu(x * bn["weight"][:, None, None] + bn["bias"][:, None, None])


def _csp(sd: dict[str, torch.Tensor], name: str, x: torch.Tensor, identity: bool) -> torch.Tensor:
    main = _conv_bn_silu(sd, f"{name}.main_conv", x)
    blocks = sum(1 for k in sd if k.startswith(f"{name}.blocks.") and k.endswith(".conv1.conv.weight"))
    for i in range(blocks):
        b = f"{name}.blocks.{i}"
        out = _conv_bn_silu(sd, f"{b}.conv1", main)
        out = _conv_bn_silu(sd, f"{b}.conv2.depthwise_conv", out, groups=out.shape[1])
        out = _conv_bn_silu(sd, f"{b}.conv2.pointwise_conv", out)
        main = out + main if identity else out
    cat = torch.cat([main, _conv_bn_silu(sd, f"{name}.short_conv", x)], 1)
    w = F.conv2d(cat.mean((2, 3), keepdim=True), sd[f"{name}.attention.fc.weight"], sd[f"{name}.attention.fc.bias"])
    return _conv_bn_silu(sd, f"{name}.final_conv", cat * torch.clamp(w / 6 + 0.5, 0, 1))


def _scale_norm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return x / torch.clamp(x.pow(2).sum(-1, keepdim=True).sqrt() / x.shape[-1] ** 0.5, min=1e-5) * g


def reference_simcc(sd: dict[str, torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CSPNeXt-P5 + RTMCC head from the key table's config, by hand (no module of the port).

    Widths and block counts come from the tensors, so the narrow test model runs through it too.
    """
    sd = {k[len("backbone.") :] if k.startswith("backbone.") else k: v for k, v in sd.items()}
    x = _conv_bn_silu(sd, "stem.0", x, stride=2)
    x = _conv_bn_silu(sd, "stem.1", x)
    x = _conv_bn_silu(sd, "stem.2", x)
    for stage in (1, 2, 3):
        x = _conv_bn_silu(sd, f"stage{stage}.0", x, stride=2)
        x = _csp(sd, f"stage{stage}.1", x, identity=True)
    x = _conv_bn_silu(sd, "stage4.0", x, stride=2)
    x = _conv_bn_silu(sd, "stage4.1.conv1", x)
    x = torch.cat([x] + [F.max_pool2d(x, k, 1, k // 2) for k in (5, 9, 13)], 1)
    x = _conv_bn_silu(sd, "stage4.1.conv2", x)
    x = _csp(sd, "stage4.2", x, identity=False)
    # head
    x = F.conv2d(x, sd["head.final_layer.weight"], sd["head.final_layer.bias"], padding=3).flatten(2)
    x = _scale_norm(x, sd["head.mlp.0.g"]) @ sd["head.mlp.1.weight"].T
    y = F.silu(_scale_norm(x, sd["head.gau.ln.g"]) @ sd["head.gau.uv.weight"].T)
    u, v, base = y[..., :512], y[..., 512:1024], y[..., 1024:]
    q = base * sd["head.gau.gamma"][0] + sd["head.gau.beta"][0]
    k = base * sd["head.gau.gamma"][1] + sd["head.gau.beta"][1]
    kernel = F.relu(q @ k.transpose(1, 2) / 128**0.5) ** 2
    x = x * sd["head.gau.res_scale.scale"] + (u * (kernel @ v)) @ sd["head.gau.o.weight"].T
    return x @ sd["head.cls_x.weight"].T, x @ sd["head.cls_y.weight"].T


def reference_landmarks(sd: dict[str, torch.Tensor], frame: np.ndarray) -> np.ndarray:
    """Upstream's whole-frame top-down inference, written from the config with closed-form geometry."""
    h, w = frame.shape[:2]
    scale_w, scale_h = w * 1.25, h * 1.25
    scale_w, scale_h = (
        (scale_w, scale_w * 384 / 288) if scale_w / scale_h > 288 / 384 else (scale_h * 288 / 384, scale_h)
    )
    s = 288 / scale_w
    matrix = np.array([[s, 0, 144 - s * w / 2], [0, s, 192 - s * h / 2]])
    crop = cv2.warpAffine(frame, matrix, (288, 384), flags=cv2.INTER_LINEAR)
    prep = CONFIG["data_preprocessor"]
    rgb = (crop[..., ::-1].astype(np.float32) - np.float32(prep["mean_rgb"])) / np.float32(prep["std_rgb"])
    x = torch.from_numpy(np.ascontiguousarray(rgb.transpose(2, 0, 1)))[None].to(sd["head.cls_x.weight"].dtype)
    with torch.no_grad():
        sx, sy = reference_simcc(sd, x)
        fx, fy = reference_simcc(sd, x.flip(-1))
    idx = CONFIG["flip_indices"]
    sx, sy = ((sx + fx[:, idx].flip(-1)) / 2)[0].numpy(), ((sy + fy[:, idx]) / 2)[0].numpy()
    kp = np.stack([sx.argmax(1), sy.argmax(1)], 1) / 2.0
    kp[np.minimum(sx.max(1), sy.max(1)) <= 0] = -0.5
    frame_kp = (kp - np.array([144, 192])) / s + np.array([w / 2, h / 2])
    return frame_kp[23:91]


# -- the module and its file -----------------------------------------------------------------------


def test_state_dict_equals_the_public_key_table() -> None:
    got = [[k, list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in RTMPoseWholeBody().state_dict().items()]
    assert got == TABLE["keys"]
    assert sum(v.numel() for v in RTMPoseWholeBody().state_dict().values()) == TABLE["summary"]["num_elements"]


def test_flip_indices_are_the_configs() -> None:
    assert list(FLIP_INDICES) == CONFIG["flip_indices"]


def _mmengine_file(tmp_path: Path, state_dict: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkpoint in mmengine's layout: `meta` and `message_hub` holding numpy arrays and a library object."""
    module = types.ModuleType("mmengine.logging.history_buffer")

    class HistoryBuffer:
        def __init__(self) -> None:
            self._log_history = np.arange(3.0)

    HistoryBuffer.__module__ = module.__name__
    HistoryBuffer.__qualname__ = "HistoryBuffer"
    module.HistoryBuffer = HistoryBuffer  # type: ignore[attr-defined]
    with monkeypatch.context() as patch:  # importable only while the file is written
        for name in ("mmengine", "mmengine.logging", module.__name__):
            patch.setitem(sys.modules, name, module if name == module.__name__ else types.ModuleType(name))
        blob = {
            "meta": {"dataset_meta": {"sigmas": np.ones(133, dtype=np.float32)}, "seed": 21, "epoch": 270},
            "state_dict": {f"module.{k}": v for k, v in state_dict.items()},
            "message_hub": {"log_scalars": {"train/loss": HistoryBuffer()}, "runtime_info": {"iter": 1}},
            "ema_state_dict": {"steps": torch.tensor(1)},
        }
        path = tmp_path / "dw-ll_ucoco_384.pth"
        torch.save(blob, path)
    return path


def test_an_mmengine_checkpoint_loads_and_runs(seeded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, sd = seeded
    path = _mmengine_file(tmp_path, sd, monkeypatch)
    loaded = load_landmarker(path)
    assert "mmengine" not in sys.modules  # the library object was never imported
    assert not loaded.training
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, sd[key]), key
    with torch.no_grad():
        simcc_x, simcc_y = loaded(torch.zeros(1, 3, 384, 288))
    assert simcc_x.shape == (1, 133, 576) and simcc_y.shape == (1, 133, 768)


def test_a_bare_state_dict_loads(seeded, tmp_path: Path) -> None:
    _, sd = seeded
    path = tmp_path / "bare.pth"
    torch.save(sd, path)
    assert torch.equal(load_landmarker(path).head.cls_x.weight, sd["head.cls_x.weight"])


def test_a_file_that_does_not_fit_names_the_missing_and_unexpected_keys(seeded, tmp_path: Path) -> None:
    _, sd = seeded
    broken = {k: v for k, v in sd.items() if k != "head.gau.gamma"}
    broken["head.gau.w"] = torch.zeros(265)  # a GAU with a relative-position bias: another config
    path = tmp_path / "other.pth"
    torch.save({"meta": {}, "state_dict": broken}, path)
    with pytest.raises(CheckpointError) as err:
        load_landmarker(path)
    assert "missing keys: head.gau.gamma" in str(err.value)
    assert "unexpected keys: head.gau.w" in str(err.value)


def test_a_mis_shaped_tensor_is_named(seeded, tmp_path: Path) -> None:
    _, sd = seeded
    path = tmp_path / "narrow.pth"
    torch.save({"state_dict": {**sd, "head.cls_y.weight": torch.zeros(512, 256)}}, path)
    with pytest.raises(CheckpointError, match=r"head.cls_y.weight: checkpoint \[512, 256\] vs model \[768, 256\]"):
        load_landmarker(path)


# -- numerics ------------------------------------------------------------------------------------------


def test_simcc_logits_match_the_functional_computation(seeded) -> None:
    model, sd = seeded
    x = torch.randn(1, 3, 384, 288, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got_x, got_y = model(x)
        want_x, want_y = reference_simcc(sd, x)
    assert got_x.shape == (1, 133, 576) and got_y.shape == (1, 133, 768)
    assert _rel(got_x, want_x) < 1e-4
    assert _rel(got_y, want_y) < 1e-4


def test_face_landmarks_match_the_independent_pipeline(narrow) -> None:
    model, sd = narrow
    # In float64 the two computations agree far below any gap between two SimCC bins, so the argmax
    # decode picks the same bins; fp32 agreement is the test above.
    model64 = RTMPoseWholeBody(widen_factor=0.25, deepen_factor=1 / 3).double().eval()
    model64.load_state_dict(sd)
    frame = _frame()
    got = face_landmarks(model64, frame)
    assert got.shape == (68, 2) and got.dtype == np.float64
    sd64 = {k: v.double() for k, v in sd.items()}
    want = reference_landmarks(sd64, frame)
    np.testing.assert_allclose(got, want, atol=1e-3)
    assert len(np.unique(got, axis=0)) > 20  # landmarks that differ, not one bin for all
    # The output depends on the image: the mirrored frame gives other landmarks. In one batch, frames
    # of other sizes each get their own box.
    mirrored, small = frame[:, ::-1].copy(), cv2.resize(frame, (200, 150))
    batch = face_landmarks_batch(model64, [frame, mirrored, small])
    assert batch.shape == (3, 68, 2)
    np.testing.assert_allclose(batch[0], want, atol=1e-3)
    np.testing.assert_allclose(batch[1], face_landmarks(model64, mirrored), atol=1e-3)
    np.testing.assert_allclose(batch[2], reference_landmarks(sd64, small), atol=1e-3)
    assert not np.allclose(batch[1], got)
    # In fp32 every keypoint of the 133 lands in frame pixels, within the padded box (x from -40,
    # y from -146.7 for 320x240) or at upstream's "no keypoint" -0.5 input px.
    keypoints, scores = whole_body_keypoints(model, frame)
    assert keypoints.shape == (133, 2) and scores.shape == (133,)
    assert np.all(keypoints >= [-41, -148]) and np.all(keypoints <= [361, 387])


# -- geometry and decode on hand-made cases ----------------------------------------------------------


def test_whole_frame_affine_pads_and_fixes_the_aspect() -> None:
    # 640x480: the box 800x600 after padding is wider than 3:4, so its height grows to 800 * 4/3.
    center, scale, matrix = whole_frame_affine(480, 640)
    np.testing.assert_allclose(center, [320, 240])
    np.testing.assert_allclose(scale, [800, 800 * 4 / 3], rtol=1e-6)
    s = 288 / 800
    np.testing.assert_allclose(matrix, [[s, 0, 144 - s * 320], [0, s, 192 - s * 240]], atol=1e-4)
    # A tall frame (300x1000): the height rules, the width grows to 1250 * 3/4.
    _, scale, _ = whole_frame_affine(1000, 300)
    np.testing.assert_allclose(scale, [1250 * 0.75, 1250], rtol=1e-6)


def test_preprocess_warps_a_dot_to_where_the_affine_says_and_normalises_rgb() -> None:
    frame = np.zeros((480, 640, 3), dtype=np.uint8)
    frame[298:303, 498:503] = (255, 0, 0)  # a blue dot centred on (500, 300), BGR
    x, center, scale = preprocess(frame)
    assert x.shape == (1, 3, 384, 288)
    s = 288 / 800
    want = (144 + s * (500 - 320), 192 + s * (300 - 240))
    blue = x[0, 2].numpy()  # RGB order after the flip: channel 2 is blue
    y, x_ = np.unravel_index(blue.argmax(), blue.shape)
    assert abs(x_ - want[0]) <= 1 and abs(y - want[1]) <= 1
    # Black is (0 - mean) / std per RGB channel; outside the frame is black too.
    np.testing.assert_allclose(x[0, :, 0, 0].numpy(), [-123.675 / 58.395, -116.28 / 57.12, -103.53 / 57.375], rtol=1e-6)
    # And the inverse maps that input pixel back to the dot.
    np.testing.assert_allclose(input_to_frame(np.array(want, dtype=np.float32), center, scale), [500, 300], atol=1e-3)


def test_a_simcc_peak_decodes_to_its_pixel_in_the_frame() -> None:
    simcc_x = np.full((133, 576), -1.0, dtype=np.float32)
    simcc_y = np.full((133, 768), -1.0, dtype=np.float32)
    simcc_x[23 + 29, 400] = 5.0  # landmark 29 at input (200, 150)
    simcc_y[23 + 29, 300] = 3.0
    keypoints, scores = decode_simcc(simcc_x, simcc_y)
    assert keypoints[52].tolist() == [200.0, 150.0] and scores[52] == 3.0
    # Nothing above zero elsewhere: upstream's "no keypoint" bin -1, i.e. -0.5 input px.
    assert keypoints[0].tolist() == [-0.5, -0.5] and scores[0] == -1.0
    # In a 640x480 frame: input px x 800/288, shifted by the box's corner (320 - 400, 240 - 533.3).
    center, scale, _ = whole_frame_affine(480, 640)
    frame_xy = input_to_frame(keypoints, center, scale)[52]
    np.testing.assert_allclose(frame_xy, [200 * 800 / 288 - 80, 150 * 800 / 288 + 240 - 400 * 4 / 3], atol=1e-3)


def test_decode_takes_the_first_maximum_and_the_smaller_score() -> None:
    simcc_x = np.zeros((1, 576), dtype=np.float32)
    simcc_y = np.zeros((1, 768), dtype=np.float32)
    simcc_x[0, [10, 20]] = 2.0
    simcc_y[0, 7] = 0.5
    keypoints, scores = decode_simcc(simcc_x, simcc_y)
    assert keypoints.tolist() == [[5.0, 3.5]] and scores.tolist() == [0.5]


def test_flip_maps_mirrored_vectors_back() -> None:
    simcc_x = torch.zeros(1, 133, 576)
    simcc_y = torch.zeros(1, 133, 768)
    simcc_x[0, 24, 10] = 1.0  # face-1 (left jaw) seen in the mirror, near the left edge
    simcc_y[0, 24, 99] = 1.0
    fx, fy = flip_simcc(simcc_x, simcc_y)
    assert fx[0, 38].argmax() == 565 and fy[0, 38].argmax() == 99  # face-15, near the right edge
    assert fx[0, 24].abs().sum() == 0
    assert fx[0, 0, :].abs().sum() == 0  # the nose is its own mirror


# -- the MuseTalk box rules -----------------------------------------------------------------------


def _landmarks(x_min: float, x_max: float, nose_y: float, chin_y: float) -> np.ndarray:
    lm = np.zeros((68, 2))
    lm[:, 0] = np.linspace(x_min, x_max, 68)
    lm[:, 1] = np.linspace(nose_y, chin_y, 68)
    lm[29] = [(x_min + x_max) / 2, nose_y]
    return lm


def test_musetalk_box_centres_landmark_29_and_adds_the_chin_margin() -> None:
    lm = _landmarks(20.9, 90.5, 100.9, 160.2)  # truncated: x 20..90, lm29.y 100, chin 160
    assert musetalk_box(lm, frame_h=480) == (20, 40, 90, 170)
    assert musetalk_box(lm, frame_h=480, extra_margin=0) == (20, 40, 90, 160)
    assert musetalk_box(lm, frame_h=165) == (20, 40, 90, 165)  # the margin stops at the frame
    assert musetalk_box(lm, frame_h=480, frame_w=80) == (20, 40, 80, 170)


def test_musetalk_box_top_stops_at_the_frame() -> None:
    assert musetalk_box(_landmarks(10, 50, 30, 100), frame_h=200) == (10, 0, 50, 110)


def test_musetalk_box_refuses_what_upstream_refuses() -> None:
    assert musetalk_box(_landmarks(-5, 50, 30, 100), frame_h=200) is None  # x1 < 0
    assert musetalk_box(_landmarks(10, 10.5, 30, 100), frame_h=200) is None  # no width
    flat = _landmarks(10, 50, 0, 0)
    assert musetalk_box(flat, frame_h=200) is None  # no height
    with pytest.raises(ValueError, match="68 landmarks"):
        musetalk_box(np.zeros((133, 2)), frame_h=200)


def test_box_from_face_detection_keeps_musetalk_proportions() -> None:
    # 100 px high: landmark 29 at 51 px below the top, the chin 8 px below the bottom; the box is
    # centred on landmark 29 and reaches 10 px below the chin.
    assert box_from_face_detection((100, 50, 200, 150), frame_h=480) == (100, 44, 200, 168)
    assert box_from_face_detection((100, 50, 200, 150), frame_h=165) == (100, 44, 200, 165)
    assert box_from_face_detection((100, 0, 200, 100), frame_h=480) == (100, 0, 200, 118)  # top clipped
    assert box_from_face_detection((100, 50, 100, 160), frame_h=480) is None


def test_box_from_face_detection_on_the_sample_avatar() -> None:
    """The bundled detector's box on samples/avatar.jpg, and the box the rule makes of it: centred on the
    lower nose (y 119) and ending 10 px below the chin (y 177), as read off the photo."""
    frame = cv2.imread(str(Path(__file__).resolve().parents[4] / "samples" / "avatar.jpg"))
    (face,) = HaarFaceDetector().detect([frame])
    assert face == (177, 67, 270, 169)
    assert box_from_face_detection(face, frame_h=frame.shape[0]) == (177, 61, 270, 187)
