"""Architecture checks against the upstream key tables, plus forward-pass shape/semantics tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from services.inference.checkpoints import seeded_state_dict
from services.superres.models import SR_MODELS, RRDBNet, SRVGGNetCompact, create_sr_model

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "data" / "reference"


def _variants(name: str) -> dict:
    return json.loads((REFERENCE_DIR / name).read_text())["variants"]


def _keys(model: nn.Module) -> list[list]:
    return [[k, list(v.shape)] for k, v in model.state_dict().items()]


def _seeded(model: nn.Module) -> nn.Module:
    model.load_state_dict(seeded_state_dict(model))
    return model.eval()


@pytest.mark.parametrize("variant", ["realesr-general-x4v3", "realesr-animevideov3"])
def test_srvgg_keys_match_reference(variant: str) -> None:
    ref = _variants("srvgg_keys.json")[variant]
    model = SRVGGNetCompact(**ref["config"])
    assert _keys(model) == ref["keys"]
    assert len(ref["keys"]) == ref["summary"]["num_keys"]
    learnable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert learnable == ref["summary"]["num_parameters"]
    assert list(model.buffers()) == []


def test_srvgg_param_counts() -> None:
    counts = [sum(p.numel() for p in SRVGGNetCompact(num_conv=n).parameters() if p.requires_grad) for n in (32, 16)]
    assert counts == [1_213_296, 621_424]


@pytest.mark.parametrize("variant", ["RealESRGAN_x4plus", "RealESRGAN_x2plus"])
def test_rrdb_keys_match_reference(variant: str) -> None:
    ref = _variants("rrdbnet_keys.json")[variant]
    model = RRDBNet(**ref["config"])
    assert _keys(model) == ref["keys"]
    assert sum(p.numel() for p in model.parameters()) == ref["summary"]["num_parameters"]


@pytest.mark.parametrize("name", list(SR_MODELS))
def test_registry_builds_reference_keys(name: str) -> None:
    table = "srvgg_keys.json" if SR_MODELS[name]["arch"] == "srvgg" else "rrdbnet_keys.json"
    model = create_sr_model(name, None)
    assert _keys(model) == _variants(table)[name]["keys"]
    assert not model.training


def test_unknown_model_name_lists_known_names() -> None:
    with pytest.raises(ValueError, match="realesr-general-x4v3"):
        create_sr_model("nope", None)


@pytest.mark.parametrize("act_type", ["prelu", "relu", "leakyrelu"])
def test_srvgg_forward_shape(act_type: str) -> None:
    model = _seeded(SRVGGNetCompact(num_conv=32, act_type=act_type))
    with torch.inference_mode():
        out = model(torch.rand(1, 3, 24, 20))
    assert out.shape == (1, 3, 96, 80)


def test_srvgg_bad_activation() -> None:
    with pytest.raises(ValueError, match="act_type"):
        SRVGGNetCompact(act_type="gelu")


def test_srvgg_zero_last_conv_is_nearest_upsample() -> None:
    model = _seeded(SRVGGNetCompact(num_conv=16))
    with torch.no_grad():
        model.body[-1].weight.zero_()
        model.body[-1].bias.zero_()
    x = torch.rand(2, 3, 11, 7)
    with torch.inference_mode():
        out = model(x)
    assert torch.equal(out, F.interpolate(x, scale_factor=4, mode="nearest"))


@pytest.mark.parametrize("scale", [4, 2, 1])
def test_rrdb_forward_shape(scale: int) -> None:
    model = _seeded(RRDBNet(scale=scale, num_block=2))
    with torch.inference_mode():
        out = model(torch.rand(2, 3, 16, 12))
    assert out.shape == (2, 3, 16 * scale, 12 * scale)
    assert torch.isfinite(out).all()


def test_rrdb_x2_unshuffle_channel_order() -> None:
    """conv_first of the x2 model sees channel c*4 + dy*2 + dx = x[c, 2i+dy, 2j+dx]."""
    model = _seeded(RRDBNet(scale=2, num_block=1))
    seen: list[torch.Tensor] = []
    model.conv_first.register_forward_hook(lambda _m, inp, _out: seen.append(inp[0]))
    x = torch.rand(1, 3, 8, 6)
    with torch.inference_mode():
        model(x)
    (feat,) = seen
    assert feat.shape == (1, 12, 4, 3)
    for c in range(3):
        for dy in range(2):
            for dx in range(2):
                assert torch.equal(feat[0, c * 4 + dy * 2 + dx], x[0, c, dy::2, dx::2])


def test_rrdb_rejects_bad_scale() -> None:
    with pytest.raises(ValueError, match="scale"):
        RRDBNet(scale=3)
