"""The web page's server is a small CPU pod: importing it loads no torch (its image installs none)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_importing_the_web_app_loads_no_torch() -> None:
    code = "import services.web.app, services.web.service, sys; sys.exit('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"services.web imports torch (or failed to import):\n{result.stderr[-3000:]}"
