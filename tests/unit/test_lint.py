"""ruff keeps the style: pyflakes and pycodestyle rules over the whole tree (config in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing() -> None:
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        found = shutil.which("ruff")
        if found is None:
            pytest.skip("needs ruff (requirements.lock; bash scripts/install.sh installs it)")
        ruff = Path(found)
    result = subprocess.run([str(ruff), "check", "--output-format", "concise", "."], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
