"""Pre/post-processing and upscaler behaviour (colour order, padding, output sizes)."""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from services.inference.checkpoints import seeded_state_dict
from services.superres.models import RRDBNet, SRVGGNetCompact
from services.superres.upscaler import (
    LanczosUpscaler,
    ModelUpscaler,
    create_upscaler,
    from_model_output,
    reflect_pad,
    to_model_input,
)


def _crops(b: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (b, h, w, 3), dtype=np.uint8)


def _zero_residual_srvgg() -> SRVGGNetCompact:
    """A seeded SRVGG whose last conv is zero: the output is the nearest x4 upsample of the input."""
    model = SRVGGNetCompact(num_conv=2)
    model.load_state_dict(seeded_state_dict(model))
    with torch.no_grad():
        model.body[-1].weight.zero_()
        model.body[-1].bias.zero_()
    return model.eval()


class _Nearest(nn.Module):
    """Stand-in network: nearest upsampling, so padding/cropping errors show up exactly."""

    def __init__(self, scale: int) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=self.scale, mode="nearest")


def test_to_model_input_layout() -> None:
    crops = _crops(2, 5, 4)
    x = to_model_input(crops)
    assert x.shape == (2, 3, 5, 4) and x.dtype == torch.float32
    # channel 0 is R, which is the last channel of BGR
    assert torch.allclose(x[1, 0], torch.from_numpy(crops[1, :, :, 2]).float() / 255)
    assert float(x.min()) >= 0 and float(x.max()) <= 1


def test_round_trip_is_exact_for_all_values() -> None:
    crops = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1).repeat(3, axis=-1)
    crops[..., 0] = crops[..., 0][:, ::-1]  # make channels differ
    assert np.array_equal(from_model_output(to_model_input(crops)), crops)


def test_from_model_output_clamps_and_rounds() -> None:
    t = torch.tensor([-0.5, 0.5 / 255, 1.5 / 255, 2.0]).reshape(1, 1, 1, 4).repeat(1, 3, 1, 1)
    out = from_model_output(t)
    assert out.shape == (1, 1, 4, 3) and out.dtype == np.uint8
    assert out[0, 0, :, 0].tolist() == [0, 0, 2, 255]  # round half to even, like numpy


def test_reflect_pad_right_bottom() -> None:
    x = torch.arange(7 * 9, dtype=torch.float32).reshape(1, 1, 7, 9)
    padded, pad_h, pad_w = reflect_pad(x, 2)
    assert (pad_h, pad_w) == (1, 1) and padded.shape == (1, 1, 8, 10)
    assert torch.equal(padded[..., :7, :9], x)
    assert torch.equal(padded[..., 7, :9], x[..., 5, :])  # reflect: row h-2
    assert reflect_pad(x, 1)[0] is x


@pytest.mark.parametrize("scale", [2, 1])
def test_odd_sizes_are_padded_and_cropped(scale: int) -> None:
    crops = _crops(2, 7, 9)
    up = ModelUpscaler(_Nearest(scale), scale=scale)
    out = up.upscale(crops, (9 * scale, 7 * scale))
    expected = crops.repeat(scale, axis=1).repeat(scale, axis=2)
    assert all(np.array_equal(o, e) for o, e in zip(out, expected))


def test_rrdb_x2_odd_size_shape() -> None:
    model = RRDBNet(scale=2, num_block=1)
    model.load_state_dict(seeded_state_dict(model))
    out = ModelUpscaler(model, scale=2).upscale(_crops(1, 7, 9), (18, 14))
    assert out[0].shape == (14, 18, 3) and out[0].dtype == np.uint8


def test_zero_residual_srvgg_is_nearest_upsample() -> None:
    crops = _crops(3, 6, 5)
    out = ModelUpscaler(_zero_residual_srvgg(), scale=4).upscale(crops, (20, 24))
    expected = crops.repeat(4, axis=1).repeat(4, axis=2)
    assert all(np.array_equal(o, e) for o, e in zip(out, expected))


def test_blue_stays_blue() -> None:
    crops = np.zeros((1, 8, 8, 3), np.uint8)
    crops[..., 0] = 255  # pure blue in BGR
    model = _zero_residual_srvgg()
    seen: list[torch.Tensor] = []
    model.body[0].register_forward_hook(lambda _m, inp, _out: seen.append(inp[0]))
    (out,) = ModelUpscaler(model, scale=4).upscale(crops, (32, 32))
    assert (out[..., 0] == 255).all() and (out[..., 1:] == 0).all()
    # the network itself saw RGB: blue is channel 2
    assert torch.equal(seen[0][0, 2], torch.ones(8, 8)) and not seen[0][0, :2].any()


def test_model_upscaler_per_item_sizes() -> None:
    model = SRVGGNetCompact(num_conv=2)
    model.load_state_dict(seeded_state_dict(model))
    up = ModelUpscaler(model, scale=4, model_name="test")
    sizes = [(100, 90), (96, 96), (50, 61)]
    out = up.upscale(_crops(3, 24, 24), sizes)
    assert [o.shape for o in out] == [(90, 100, 3), (96, 96, 3), (61, 50, 3)]
    assert all(o.dtype == np.uint8 for o in out)
    up.warmup()
    assert up.upscale(np.zeros((0, 24, 24, 3), np.uint8), (96, 96)) == []


def test_resize_uses_lanczos4() -> None:
    crops = _crops(1, 6, 5)
    (out,) = ModelUpscaler(_zero_residual_srvgg(), scale=4).upscale(crops, (33, 17))
    nearest = crops[0].repeat(4, axis=0).repeat(4, axis=1)
    assert np.array_equal(out, cv2.resize(nearest, (33, 17), interpolation=cv2.INTER_LANCZOS4))


def test_lanczos_fallback_sizes() -> None:
    up = LanczosUpscaler()
    assert up.model_name == "lanczos"
    crops = _crops(2, 40, 30)
    out = up.upscale(crops, [(61, 77), (30, 40)])
    assert [o.shape for o in out] == [(77, 61, 3), (40, 30, 3)]
    assert np.array_equal(out[1], crops[1])
    assert [o.shape for o in up.upscale(crops, (128, 100))] == [(100, 128, 3)] * 2
    up.warmup()


def test_bad_inputs() -> None:
    up = LanczosUpscaler()
    with pytest.raises(ValueError, match="uint8"):
        up.upscale(np.zeros((1, 8, 8, 3), np.float32), (16, 16))
    with pytest.raises(ValueError, match="output sizes"):
        up.upscale(_crops(2, 8, 8), [(16, 16)])


def test_create_upscaler_without_checkpoint_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        up = create_upscaler("realesr-general-x4v3", None)
    assert isinstance(up, LanczosUpscaler)
    assert "weight-free" in caplog.text


def test_create_upscaler_with_checkpoint(tmp_path: Path) -> None:
    sd = seeded_state_dict(SRVGGNetCompact(num_conv=16))
    path = tmp_path / "anime.pth"
    torch.save({"params": sd}, path)
    up = create_upscaler("realesr-animevideov3", str(path))
    assert isinstance(up, ModelUpscaler)
    assert up.model_name == "realesr-animevideov3" and up.scale == 4 and up.dtype == torch.float32
    up.warmup(size=(8, 8))
    with pytest.raises(ValueError, match="model name"):
        create_upscaler(None, str(path))
