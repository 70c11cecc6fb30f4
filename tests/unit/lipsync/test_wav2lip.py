"""Wav2Lip generator: exact upstream state-dict layout, forward contract, checkpoint loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from services.inference.checkpoints import seeded_state_dict
from services.lipsync.wav2lip import WAV2LIP_INFO, Wav2Lip, checkpoint_filter_fn, create_wav2lip, load_wav2lip
from services.serving.errors import CheckpointError

REFERENCE = Path(__file__).resolve().parents[2] / "data" / "reference" / "wav2lip_keys.json"


@pytest.fixture(scope="module")
def seeded() -> tuple[Wav2Lip, dict[str, torch.Tensor]]:
    model = Wav2Lip()
    sd = seeded_state_dict(model)
    model.load_state_dict(sd)
    return model.eval(), sd


def _inputs(batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    audio = torch.rand(batch, 1, 80, 16, generator=gen) * 8 - 4
    faces = torch.rand(batch, 6, 96, 96, generator=gen)
    return audio, faces


def test_state_dict_matches_upstream_keys_shapes_and_order() -> None:
    expected = json.loads(REFERENCE.read_text())["keys"]
    got = [[k, list(v.shape)] for k, v in Wav2Lip().state_dict().items()]
    assert got == expected


def test_parameter_count_and_metadata() -> None:
    model = Wav2Lip()
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 36_298_035
    assert model.model_name == "wav2lip"
    assert WAV2LIP_INFO == {"img_size": 96, "mel_step_size": 16, "fps": 25}


def test_forward_shape_and_range(seeded) -> None:
    model, _ = seeded
    with torch.no_grad():
        out = model(*_inputs())
    assert out.shape == (2, 3, 96, 96)
    assert out.dtype == torch.float32
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0


def test_load_prefixed_checkpoint_container(seeded, tmp_path: Path) -> None:
    model, sd = seeded
    path = tmp_path / "wav2lip.pth"
    torch.save(
        {"state_dict": {f"module.{k}": v for k, v in sd.items()}, "optimizer": {}, "global_step": 0, "global_epoch": 0},
        path,
    )
    loaded = load_wav2lip(path)
    assert not loaded.training
    audio, faces = _inputs()
    with torch.no_grad():
        assert torch.equal(loaded(audio, faces), model(audio, faces))


def test_load_bare_keys_and_create(seeded, tmp_path: Path) -> None:
    _, sd = seeded
    path = tmp_path / "bare.pth"
    torch.save({"state_dict": sd}, path)
    loaded = create_wav2lip(str(path))
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, sd[key]), key
    assert not create_wav2lip(None).training


def test_filter_strips_module_prefix() -> None:
    t = torch.zeros(1)
    assert list(checkpoint_filter_fn({"module.a.b": t, "c": t})) == ["a.b", "c"]


def test_wrong_keys_are_named(seeded, tmp_path: Path) -> None:
    _, sd = seeded
    broken = dict(sd)
    dropped = "output_block.1.bias"
    del broken[dropped]
    broken["extra_head.weight"] = torch.zeros(3)
    path = tmp_path / "broken.pth"
    torch.save({"state_dict": broken}, path)
    with pytest.raises(CheckpointError) as info:
        load_wav2lip(path)
    assert dropped in str(info.value)
    assert "extra_head.weight" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError):
        load_wav2lip(tmp_path / "nope.pth")
