"""Tests for services.inference.checkpoints: prefix cleaning, reading, strict loading, seeded weights."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
import torch
from torch import nn

from services.inference.checkpoints import (
    clean_state_dict,
    load_strict,
    read_checkpoint,
    read_state_dict_file,
    seeded_state_dict,
)
from services.serving.errors import CheckpointError


def _small() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))


# -- clean_state_dict ------------------------------------------------------------------------------


def test_clean_state_dict_strips_wrapper_prefixes() -> None:
    t = torch.zeros(1)
    cleaned = clean_state_dict(
        {
            "module.a.weight": t,
            "_orig_mod.b.weight": t,
            "module.module.c.weight": t,
            "_orig_mod.module.d.weight": t,  # torch.compile of a DataParallel model
            "module._orig_mod.e.weight": t,
            "f.weight": t,
        }
    )
    assert list(cleaned) == ["a.weight", "b.weight", "c.weight", "d.weight", "e.weight", "f.weight"]
    assert all(v is t for v in cleaned.values())


def test_clean_state_dict_only_strips_leading_prefixes() -> None:
    t = torch.zeros(1)
    cleaned = clean_state_dict({"encoder.module.x": t, "modules.0.w": t, "my_orig_mod.w": t})
    assert list(cleaned) == ["encoder.module.x", "modules.0.w", "my_orig_mod.w"]


def test_clean_state_dict_of_a_wrapped_model_loads_into_the_plain_one() -> None:
    model = _small()
    wrapped = nn.DataParallel(_small())
    state = clean_state_dict(wrapped.state_dict())
    assert all(k.startswith("module.") for k in wrapped.state_dict())
    load_strict(model, state, "wrapped")
    for key, value in model.state_dict().items():
        assert torch.equal(value, wrapped.module.state_dict()[key])


# -- read_checkpoint -------------------------------------------------------------------------------


def _save(tmp_path: Path, obj: object, name: str = "ckpt.pth") -> Path:
    path = tmp_path / name
    torch.save(obj, path)
    return path


def test_read_checkpoint_prefers_entries_in_order(tmp_path: Path) -> None:
    ema, plain = {"w": torch.ones(2)}, {"w": torch.zeros(2)}
    path = _save(tmp_path, {"params": plain, "params_ema": ema, "epoch": 3})
    got = read_checkpoint(path, ["params_ema", "params"])
    assert torch.equal(got["w"], torch.ones(2))
    got = read_checkpoint(path, ["params", "params_ema"])
    assert torch.equal(got["w"], torch.zeros(2))


def test_read_checkpoint_falls_back_to_a_later_entry(tmp_path: Path) -> None:
    path = _save(tmp_path, {"params": {"w": torch.zeros(2)}, "iter": 10})
    assert set(read_checkpoint(path, ["params_ema", "params"])) == {"w"}


def test_read_checkpoint_skips_entries_that_are_not_dicts(tmp_path: Path) -> None:
    path = _save(tmp_path, {"state_dict": 5, "params": {"w": torch.zeros(1)}})
    assert set(read_checkpoint(path, ["state_dict", "params"])) == {"w"}


def test_read_checkpoint_accepts_a_flat_state_dict(tmp_path: Path) -> None:
    state = _small().state_dict()
    path = _save(tmp_path, dict(state))
    got = read_checkpoint(path, ["state_dict"])
    assert list(got) == list(state)
    assert all(torch.equal(got[k], state[k]) for k in state)


def test_read_checkpoint_accepts_str_path(tmp_path: Path) -> None:
    path = _save(tmp_path, {"state_dict": {"w": torch.zeros(1)}})
    assert set(read_checkpoint(str(path), ["state_dict"])) == {"w"}


def test_read_checkpoint_without_a_known_entry_lists_what_it_found(tmp_path: Path) -> None:
    path = _save(tmp_path, {"model": {"w": torch.zeros(1)}, "epoch": 1})
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path, ["state_dict"])
    message = str(info.value)
    assert "['state_dict']" in message
    assert "epoch" in message and "model" in message


def test_read_checkpoint_empty_dict_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="none of the entries"):
        read_checkpoint(_save(tmp_path, {}), ["state_dict"])


@pytest.mark.parametrize("blob", [torch.zeros(3), [torch.zeros(1)], 7])
def test_read_checkpoint_non_dict_file(tmp_path: Path, blob: object) -> None:
    path = _save(tmp_path, blob)
    with pytest.raises(CheckpointError, match=f"holds a {type(blob).__name__}, expected a dict"):
        read_checkpoint(path, ["state_dict"])


def test_read_checkpoint_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "nope.pth", ["state_dict"])


def test_read_checkpoint_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a file"):
        read_checkpoint(tmp_path, ["state_dict"])


@pytest.mark.parametrize("content", [b"", b"this is not a torch file\n" * 10, b"PK\x03\x04garbage"])
def test_read_checkpoint_garbage_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.pth"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="could not be read as a torch file"):
        read_checkpoint(path, ["state_dict"])


def test_read_checkpoint_refuses_pickled_code(tmp_path: Path) -> None:
    import argparse

    # An arbitrary class (here argparse.Namespace) is refused by weights_only loading.
    path = _save(tmp_path, {"state_dict": {"w": torch.zeros(1)}, "extra": argparse.Namespace(a=1)})
    with pytest.raises(CheckpointError, match="could not be read"):
        read_checkpoint(path, ["state_dict"])


def test_read_checkpoint_inert_foreign_objects_reads_a_training_checkpoint(tmp_path: Path) -> None:
    import argparse

    import numpy as np

    # A training checkpoint: weights beside numpy arrays and a library object (here argparse.Namespace).
    blob = {"meta": {"sigmas": np.ones(3)}, "state_dict": {"w": torch.ones(2)}, "hub": argparse.Namespace(a=1)}
    path = _save(tmp_path, blob)
    with pytest.raises(CheckpointError, match="could not be read"):
        read_checkpoint(path, ["state_dict"])  # the default refuses it
    got = read_checkpoint(path, ["state_dict"], inert_foreign_objects=True)
    assert list(got) == ["w"] and torch.equal(got["w"], torch.ones(2))


def _touch(target: Path) -> None:
    target.touch()


class _Trap:
    """Pickles as a call of `_touch`: loading it for real would create the file."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (_touch, (self.target,))


def test_read_checkpoint_inert_foreign_objects_runs_nothing_from_the_file(tmp_path: Path) -> None:
    target = tmp_path / "touched"
    path = _save(tmp_path, {"state_dict": {"w": torch.zeros(1)}, "extra": _Trap(target)})
    assert read_checkpoint(path, ["state_dict"], inert_foreign_objects=True).keys() == {"w"}
    assert not target.exists()


def test_read_checkpoint_inert_foreign_objects_still_wants_tensors(tmp_path: Path) -> None:
    import argparse

    path = _save(tmp_path, {"state_dict": {"w": torch.zeros(1), "n": argparse.Namespace(a=1)}})
    with pytest.raises(CheckpointError, match=r"entry 'state_dict' holds non-tensors under \['n'\]"):
        read_checkpoint(path, ["state_dict"], inert_foreign_objects=True)


# -- read_state_dict_file (the Hugging Face folders' two formats) -----------------------------------


def test_read_state_dict_file_reads_safetensors_and_pickles(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    weights = {"a.weight": torch.arange(6.0).reshape(2, 3), "b.bias": torch.ones(2)}
    save_file(weights, str(tmp_path / "model.safetensors"))
    torch.save(weights, tmp_path / "pytorch_model.bin")
    for name in ("model.safetensors", "pytorch_model.bin"):
        loaded = read_state_dict_file(tmp_path / name)
        assert list(loaded) == list(weights) and all(torch.equal(loaded[k], weights[k]) for k in weights)


def test_read_state_dict_file_names_an_unreadable_or_missing_safetensors_file(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(CheckpointError, match="model.safetensors could not be read as safetensors"):
        read_state_dict_file(tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="absent.safetensors does not exist"):
        read_state_dict_file(tmp_path / "absent.safetensors")


# -- load_strict -----------------------------------------------------------------------------------


def test_load_strict_loads_a_matching_state_dict() -> None:
    source, target = _small(), _small()
    assert load_strict(target, source.state_dict(), "src.pth") is target
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value)


def test_load_strict_lists_missing_unexpected_and_mismatched_keys() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    state = dict(model.state_dict())
    del state["1.bias"]
    state["2.weight"] = torch.zeros(1)
    state["0.weight"] = torch.zeros(5, 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        load_strict(model, state, "weights/x.pth")
    message = str(info.value)
    assert "checkpoint weights/x.pth does not fit Sequential" in message
    assert "missing keys: 1.bias" in message
    assert "unexpected keys: 2.weight" in message
    assert "shape mismatch: 0.weight: checkpoint [5, 4] vs model [3, 4]" in message
    for key, value in model.state_dict().items():  # nothing was loaded
        assert torch.equal(value, before[key])


def test_load_strict_only_names_the_kinds_of_problems_present() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(CheckpointError) as info:
        load_strict(model, {"weight": torch.zeros(2, 2)}, "a.pth")
    message = str(info.value)
    assert "missing keys: bias" in message
    assert "unexpected" not in message and "mismatch" not in message


def test_load_strict_shortens_long_key_lists() -> None:
    model = nn.Sequential(*[nn.Linear(1, 1) for _ in range(8)])  # 16 keys
    with pytest.raises(CheckpointError) as info:
        load_strict(model, {}, "empty.pth")
    message = str(info.value)
    assert "(16 in all)" in message
    assert "0.weight" in message
    assert "7.bias" not in message


def test_load_strict_with_assign_fills_a_model_built_on_the_meta_device() -> None:
    weights = seeded_state_dict(_small())
    with torch.device("meta"):
        model = _small()
    load_strict(model, weights, "x.pth", assign=True)
    assert all(not t.is_meta for t in model.state_dict().values())
    assert torch.equal(model.state_dict()["0.weight"], weights["0.weight"])

    class WithScratch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 1, 1)
            self.register_buffer("scratch", torch.zeros(2), persistent=False)

    with torch.device("meta"):
        unset = WithScratch()
    with pytest.raises(CheckpointError, match="left scratch unset"):
        load_strict(unset, seeded_state_dict(WithScratch()), "y.pth", assign=True)


# -- seeded_state_dict -----------------------------------------------------------------------------


def _reference_draw(key: str, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(zlib.crc32(key.encode()))) * 0.02


def test_seeded_state_dict_matches_the_reference_rule_for_one_key() -> None:
    state = seeded_state_dict(_small())
    expected = _reference_draw("0.weight", (4, 3, 3, 3))
    assert torch.equal(state["0.weight"], expected)
    assert torch.equal(state["3.bias"], _reference_draw("3.bias", (2,)))


def test_seeded_state_dict_batchnorm_entries() -> None:
    state = seeded_state_dict(_small())
    assert torch.equal(state["1.weight"], 1 + _reference_draw("1.weight", (4,)))
    assert (state["1.weight"] - 1).abs().max() < 0.2
    assert torch.equal(state["1.bias"], _reference_draw("1.bias", (4,)))
    assert torch.equal(state["1.running_mean"], _reference_draw("1.running_mean", (4,)))
    assert torch.equal(state["1.running_var"], 1 + _reference_draw("1.running_var", (4,)).abs())
    assert (state["1.running_var"] >= 1).all()
    assert state["1.num_batches_tracked"].dtype == torch.long
    assert int(state["1.num_batches_tracked"]) == 0


def test_seeded_state_dict_same_key_same_numbers_regardless_of_module() -> None:
    a = seeded_state_dict(nn.Sequential(nn.Conv2d(3, 4, 3)))
    b = seeded_state_dict(_small())
    assert torch.equal(a["0.weight"], b["0.weight"])
    assert torch.equal(a["0.bias"], b["0.bias"])
    assert not torch.equal(b["0.bias"], b["1.bias"])  # different keys, different numbers


def test_seeded_state_dict_is_deterministic_covers_every_key_and_loads() -> None:
    model = _small()
    first, second = seeded_state_dict(model), seeded_state_dict(_small())
    assert list(first) == list(model.state_dict())
    for key, value in model.state_dict().items():
        assert first[key].shape == value.shape
        assert first[key].dtype == value.dtype
        assert torch.equal(first[key], second[key])
    load_strict(model, first, "seeded")


def test_seeded_state_dict_scale() -> None:
    state = seeded_state_dict(nn.Linear(8, 8), scale=1.0)
    gen = torch.Generator().manual_seed(zlib.crc32(b"weight"))
    assert torch.equal(state["weight"], torch.randn((8, 8), generator=gen))
