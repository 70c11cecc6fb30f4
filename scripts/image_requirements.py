"""The packages of one service's image: requirements.lock less what that service never imports.

services/Dockerfile runs `python3 scripts/image_requirements.py <service> requirements.lock` and
installs what it prints (the lock's own lines, so the lock's versions), then runs it again with
`--check` in the image's virtualenv: that fails the build if pip pulled an excluded package back in
as some kept package's dependency. Standard library only: it runs before the virtualenv exists.

Every image leaves out the development tools (tests, chart checks, the proto compiler: the stubs are
generated in a build stage of their own). The gateway and the render workers run no model, so
theirs also leave out torch and what only torch needs, the ONNX export tools and the mel
pipeline (librosa and its scientific stack; mel windows come from the audio service).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
from pathlib import Path

# Only the tests, the chart checks and the build need these.
DEV = frozenset({
    "pytest", "pytest-timeout", "iniconfig", "pluggy", "pygments",
    "grpcio-tools",
    "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "kubernetes-validate", "importlib-resources",
})
# torch and the packages in the lock that only torch requires.
TORCH = frozenset({"torch", "sympy", "mpmath", "networkx", "filelock", "fsspec", "jinja2", "markupsafe"})
# `python -m services.<stage>.export`: ONNX export and its onnxruntime check (GPU stages only).
ONNX = frozenset({"onnx", "onnxruntime", "ml-dtypes", "flatbuffers"})
# The mel pipeline of the audio service (services/audio/mel.py) and what only librosa requires.
MEL = frozenset({
    "librosa", "audioread", "decorator", "joblib", "lazy-loader", "llvmlite", "msgpack", "narwhals", "numba", "pooch",
    "platformdirs", "scikit-learn", "scipy", "soundfile", "soxr", "threadpoolctl", "cffi", "pycparser",
})

EXCLUDED: dict[str, frozenset[str]] = {
    "audio": DEV | ONNX,
    "lipsync": DEV,
    "superres": DEV,
    "gateway": DEV | TORCH | ONNX | MEL,
    "render": DEV | TORCH | ONNX | MEL,
}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==")


def normalize(name: str) -> str:
    """PEP 503: case and runs of -_. do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_lines(lock: Path) -> list[tuple[str, str]]:
    """(normalized name, line) for each pinned requirement of the lock, in order."""
    pinned = []
    for raw in lock.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _PIN.match(line)
        if match is None:
            raise SystemExit(f"{lock}: not a pinned requirement: {raw!r}")
        pinned.append((normalize(match.group(1)), line))
    return pinned


def requirements(service: str, lock: Path) -> list[str]:
    """The lock's lines this service's image installs."""
    if service not in EXCLUDED:
        raise SystemExit(f"unknown service {service!r}: one of {', '.join(EXCLUDED)}")
    pinned = lock_lines(lock)
    unknown = EXCLUDED[service] - {name for name, _ in pinned}
    if unknown:  # a package left the lock: keep these lists honest
        raise SystemExit(f"excluded for {service} but not in {lock}: {sorted(unknown)}")
    return [line for name, line in pinned if name not in EXCLUDED[service]]


def check_installed(service: str) -> list[str]:
    """Excluded packages that are installed in this environment anyway (should be none)."""
    installed = {normalize(d.metadata["Name"]) for d in importlib.metadata.distributions()}
    return sorted(EXCLUDED[service] & installed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("service", choices=sorted(EXCLUDED))
    parser.add_argument("lock", nargs="?", type=Path, default=Path(__file__).resolve().parents[1] / "requirements.lock")
    parser.add_argument("--check", action="store_true", help="fail if an excluded package is installed here")
    args = parser.parse_args(argv)
    if args.check:
        present = check_installed(args.service)
        if present:
            print(f"lipline-{args.service} must not contain {', '.join(present)} (a kept package requires it?)",
                  file=sys.stderr)
            return 1
        return 0
    print("\n".join(requirements(args.service, args.lock)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
