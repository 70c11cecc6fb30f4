"""Loading Real-ESRGAN checkpoint files (`params_ema`, else `params`) strictly into our modules."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch import nn

from services.inference.checkpoints import clean_state_dict, load_strict, read_checkpoint

# RealESRGANer prefers the EMA weights when the file has them (x4plus / x2plus) and otherwise uses
# `params` (the v3 compact models carry no EMA entry).
REALESRGAN_ENTRIES: tuple[str, ...] = ("params_ema", "params")


def load_realesrgan(model: nn.Module, path: str | Path, entries: Sequence[str] = REALESRGAN_ENTRIES) -> nn.Module:
    """Load a Real-ESRGAN checkpoint into `model` and switch it to eval mode.

    Args:
        model: an `SRVGGNetCompact` or `RRDBNet` built with the file's configuration.
        path: the `.pth` file.
        entries: checkpoint entries to try, in order of preference.

    Returns:
        The same module, loaded and in eval mode.

    Raises:
        CheckpointError: unreadable file, no usable entry, or missing/unexpected/mismatched keys
            (all listed in the message).
    """
    state_dict = read_checkpoint(path, entries)
    # Upstream does no prefix handling; stripping `module.` / `_orig_mod.` costs nothing and lets
    # users bring weights saved from a wrapped model.
    load_strict(model, clean_state_dict(state_dict), source=str(path))
    return model.eval()
