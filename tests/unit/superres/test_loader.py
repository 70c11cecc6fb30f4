"""Real-ESRGAN checkpoint loading: entry preference, strictness, prefix leniency."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.inference.checkpoints import seeded_state_dict
from services.serving.errors import CheckpointError
from services.superres.loader import load_realesrgan
from services.superres.models import SRVGGNetCompact, create_sr_model


def _small() -> SRVGGNetCompact:
    return SRVGGNetCompact(num_conv=2)


def _other(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v + 0.05 for k, v in sd.items()}


def _run(model: torch.nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.linspace(0, 1, 3 * 10 * 9).reshape(1, 3, 10, 9))


def _reference_output(sd: dict[str, torch.Tensor]) -> torch.Tensor:
    model = _small()
    model.load_state_dict(sd)
    return _run(model.eval())


def test_prefers_params_ema(tmp_path: Path) -> None:
    sd = seeded_state_dict(_small())
    path = tmp_path / "ema.pth"
    torch.save({"params_ema": sd, "params": _other(sd)}, path)
    model = load_realesrgan(_small().train(), path)
    assert not model.training
    assert torch.equal(_run(model), _reference_output(sd))
    assert not torch.equal(_run(model), _reference_output(_other(sd)))


def test_falls_back_to_params(tmp_path: Path) -> None:
    sd = seeded_state_dict(_small())
    path = tmp_path / "params.pth"
    torch.save({"params": sd}, path)
    assert torch.equal(_run(load_realesrgan(_small(), path)), _reference_output(sd))


def test_wrong_keys_are_listed(tmp_path: Path) -> None:
    sd = seeded_state_dict(_small())
    sd["extra.weight"] = torch.zeros(1)
    del sd["body.3.weight"]
    path = tmp_path / "bad.pth"
    torch.save({"params": sd}, path)
    with pytest.raises(CheckpointError) as info:
        load_realesrgan(_small(), path)
    assert "body.3.weight" in str(info.value)
    assert "extra.weight" in str(info.value)


def test_wrong_architecture_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "v3.pth"
    torch.save({"params": seeded_state_dict(SRVGGNetCompact(num_conv=16))}, path)
    with pytest.raises(CheckpointError, match="missing keys"):
        create_sr_model("realesr-general-x4v3", path)


def test_module_prefix_is_stripped(tmp_path: Path) -> None:
    sd = seeded_state_dict(_small())
    path = tmp_path / "ddp.pth"
    torch.save({"params_ema": {f"module.{k}": v for k, v in sd.items()}}, path)
    assert torch.equal(_run(load_realesrgan(_small(), path)), _reference_output(sd))


def test_missing_file() -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_realesrgan(_small(), "/nonexistent/x.pth")


def test_create_sr_model_loads_registered_variant(tmp_path: Path) -> None:
    sd = seeded_state_dict(SRVGGNetCompact(num_conv=16))
    path = tmp_path / "realesr-animevideov3.pth"
    torch.save({"params": sd}, path)
    model = create_sr_model("realesr-animevideov3", path)
    assert not model.training
    assert all(torch.equal(v, sd[k]) for k, v in model.state_dict().items())
