"""mypy finds nothing in services/ (config in pyproject.toml's [tool.mypy]: basic mode, strict Optional,
an unused `# type: ignore` is an error). The generated lipline/v1 stubs are read through their .pyi files."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)  # a cold run on a 2-core machine busy with the rest of the suite took over 280 s
def test_mypy_finds_nothing_in_services() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("needs mypy (requirements.lock; bash scripts/install.sh installs it)")
    # Without the stubs every lipline import is Any: errors would hide and the ignores they need turn unused.
    assert (REPO / "lipline" / "v1" / "gateway_pb2.pyi").is_file(), "run `.venv/bin/python scripts/gen_protos.py`"
    result = subprocess.run(
        # The cache (gitignored) keeps a warm run to seconds; a cold one takes about 40 s.
        [sys.executable, "-m", "mypy", "--cache-dir", str(REPO / ".mypy_cache")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
