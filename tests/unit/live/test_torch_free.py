"""A live worker is a CPU pod: importing its building blocks loads no torch (the image installs none)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
MODULES = ["services.live." + p.stem for p in sorted((REPO / "services" / "live").glob("*.py")) if p.stem != "__init__"]


def test_importing_every_live_module_loads_no_torch() -> None:
    assert "services.live.session" in MODULES and "services.live.mel_stream" in MODULES
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\nsys.exit('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code, *MODULES], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, (
        f"a services.live module imports torch (or failed to import):\n{result.stderr[-3000:]}"
    )
