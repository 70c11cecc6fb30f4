"""Where the MuseTalk tier's checkpoint files are and how their configs read: one place for the
layout (docs/architecture.md, "The 256 px tier's networks") and for the errors that say what is missing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.serving.errors import CheckpointError


def read_json_config(path: str | Path) -> dict[str, Any]:
    """The JSON object in `path` (a model's config), or a CheckpointError that names the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"model config {path} does not exist or is not a file")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"model config {path} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"model config {path} holds a {type(config).__name__}, expected a JSON object")
    return config


def weights_in(folder: str | Path, names: Sequence[str]) -> Path:
    """The first of `names` present in `folder` (the Hugging Face layouts: safetensors before pickle)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"model folder {folder} does not exist or is not a folder")
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise CheckpointError(f"model folder {folder} has none of the weight files {', '.join(names)}")
