"""External programs the tests run for real, found the same way everywhere."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


def helm_binary() -> str:
    """The helm binary: the one scripts/install.sh puts next to this Python, else one on PATH; skip without."""
    found = shutil.which("helm", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        pytest.skip("needs the helm binary (bash scripts/install.sh installs Helm v3.19.0 into .venv/bin)")
    return found
