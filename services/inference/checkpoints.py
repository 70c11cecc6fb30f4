"""Loading public checkpoint files into our modules, strictly and with messages that say what to fix.

Shared by every model family: the family-specific part is only *which entry* of the file holds the
weights (Wav2Lip: `state_dict`; Real-ESRGAN: `params_ema`, else `params`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from services.serving.errors import CheckpointError

_LOGGER = logging.getLogger(__name__)

# Wrapper prefixes added by DataParallel/DistributedDataParallel (`module.`) and torch.compile
# (`_orig_mod.`); upstream Wav2Lip strips `module.` the same way before a strict load.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def clean_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Return the state dict with wrapper prefixes removed from every key."""
    cleaned: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        # Wrappers nest in any order (torch.compile of a DataParallel model: `_orig_mod.module.`).
        while key.startswith(_WRAPPER_PREFIXES):
            key = key[len(next(p for p in _WRAPPER_PREFIXES if key.startswith(p))) :]
        cleaned[key] = value
    return cleaned


class _ForeignObject:
    """Stands in for a class or function that a checkpoint names outside the weights (see below).

    It accepts whatever the pickle hands it and keeps nothing: the object it replaces is never
    imported, so nothing from the file runs.
    """

    def __new__(cls, *args: object, **kwargs: object) -> _ForeignObject:
        return object.__new__(cls)

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __setstate__(self, state: object) -> None:
        pass


def _inert_stand_ins(path: Path) -> list[Callable[..., Any] | tuple[Callable[..., Any], str]]:
    """One `_ForeignObject` subclass per global the file names beyond torch's weights-only allowlist."""
    names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    return [(type(name.rsplit(".", 1)[-1], (_ForeignObject,), {}), name) for name in names]


def read_checkpoint(
    path: str | Path, entries: Sequence[str], *, inert_foreign_objects: bool = False
) -> dict[str, torch.Tensor]:
    """Read a `.pth` file and return the first present entry of `entries` (or the file itself).

    Args:
        path: the checkpoint file.
        entries: names of the dict entry that may hold the weights, in order of preference. A file
            that is already a flat state dict (all values tensors) is accepted as is.
        inert_foreign_objects: for training checkpoints whose other entries hold library objects
            (an mmengine file's `meta` and `message_hub`: numpy arrays, log buffers). Each class
            or function the file names beyond torch's weights-only allowlist is replaced by an
            inert stand-in, so the weights can be read without the library and without running
            anything from the file; the entry returned must still hold only tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a file")
    try:
        # weights_only: a checkpoint is data; never execute pickled code from a weights volume.
        if inert_foreign_objects:
            with torch.serialization.safe_globals(_inert_stand_ins(path)):
                blob = torch.load(path, map_location="cpu", weights_only=True)
        else:
            blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {path} could not be read as a torch file: {exc}") from exc
    if not isinstance(blob, Mapping):
        raise CheckpointError(f"checkpoint {path} holds a {type(blob).__name__}, expected a dict")
    for entry in entries:
        if entry in blob and isinstance(blob[entry], Mapping):
            _LOGGER.info("checkpoint %s: using entry %r", path, entry)
            weights = dict(blob[entry])
            others = sorted(str(k) for k, v in weights.items() if not isinstance(v, torch.Tensor))
            if inert_foreign_objects and others:
                raise CheckpointError(f"checkpoint {path}: entry {entry!r} holds non-tensors under {others[:8]}")
            return weights
    if blob and all(isinstance(v, torch.Tensor) for v in blob.values()):
        return dict(blob)
    raise CheckpointError(
        f"checkpoint {path} has none of the entries {list(entries)} (found {sorted(map(str, blob))[:8]})"
    )


def read_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """A flat state dict from a `.safetensors` file or a torch pickle (`.bin`, `.pth`).

    The Hugging Face layouts (diffusers and transformers folders) store one or the other; a pickle is
    read by `read_checkpoint` (weights only) and must be a flat state dict.
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        return read_checkpoint(path, entries=())
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a file")
    # Imported here: only the images that read Hugging Face folders (lipsync) carry safetensors.
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} could not be read as safetensors: {exc}") from exc


def load_strict(
    model: nn.Module, state_dict: Mapping[str, torch.Tensor], source: str, assign: bool = False
) -> nn.Module:
    """Load `state_dict` into `model`, failing with the missing/unexpected/mismatched keys listed.

    assign: take the state dict's tensors as the parameters instead of copying into them, so `model`
    may be built on the meta device (no initialisation, no second copy of a large network's weights).
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    mismatched = [
        f"{k}: checkpoint {list(state_dict[k].shape)} vs model {list(expected[k].shape)}"
        for k in expected
        if k in state_dict and tuple(state_dict[k].shape) != tuple(expected[k].shape)
    ]
    if missing or unexpected or mismatched:
        parts = [f"checkpoint {source} does not fit {type(model).__name__}:"]
        for title, keys in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatch", mismatched)):
            if keys:
                shown = ", ".join(keys[:10]) + (f", ... ({len(keys)} in all)" if len(keys) > 10 else "")
                parts.append(f"{title}: {shown}")
        raise CheckpointError("; ".join(parts))
    model.load_state_dict(state_dict, strict=True, assign=assign)
    if assign:
        unset = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
        if unset:  # a tensor outside the state dict (a non-persistent buffer) was never materialised
            raise CheckpointError(f"checkpoint {source}: {type(model).__name__} left {', '.join(unset[:10])} unset")
    return model


def seeded_state_dict(model: nn.Module, scale: float = 0.02) -> dict[str, torch.Tensor]:
    """Deterministic synthetic weights (the reference README's rule), for tests and benchmarks.

    Each key gets `randn(shape) * scale` from a generator seeded with crc32(key); BatchNorm weights
    are 1 + draw, running_var 1 + |draw|, num_batches_tracked 0.
    """
    import zlib

    reference = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for key, value in reference.items():
        if key.endswith("num_batches_tracked"):
            out[key] = torch.zeros_like(value)
            continue
        gen = torch.Generator().manual_seed(zlib.crc32(key.encode("utf-8")))
        draw = torch.randn(tuple(value.shape), generator=gen, dtype=torch.float32) * scale
        stem = key.rsplit(".", 1)[0]
        if key.endswith(".weight") and f"{stem}.running_var" in reference:
            draw = 1 + draw
        elif key.endswith("running_var"):
            draw = 1 + draw.abs()
        out[key] = draw.to(value.dtype)
    return out
