"""ruff keeps the style: pyflakes and pycodestyle rules and the formatter's layout over the whole tree
(config in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _ruff() -> Path:
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        found = shutil.which("ruff")
        if found is None:
            pytest.skip("needs ruff (requirements.lock; bash scripts/install.sh installs it)")
        ruff = Path(found)
    return ruff


def test_ruff_finds_nothing() -> None:
    result = subprocess.run(
        [str(_ruff()), "check", "--output-format", "concise", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_format_would_change_nothing() -> None:
    result = subprocess.run(
        [str(_ruff()), "format", "--check", "."], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, "run `.venv/bin/ruff format .`\n" + result.stdout[-4000:] + result.stderr[-2000:]
