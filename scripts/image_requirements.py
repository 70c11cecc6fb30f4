"""The packages of one service's image: requirements.lock less what that service never imports.

services/Dockerfile runs `python3 scripts/image_requirements.py <service> requirements.lock` and
installs what it prints (the lock's own lines, so the lock's versions), then runs it again with
`--check` in the image's virtualenv: that fails the build if pip pulled an excluded package back in
as some kept package's dependency. Standard library only: it runs before the virtualenv exists.

Every image leaves out the development tools (tests, chart checks, the proto compiler: the stubs are
generated in a build stage of their own), among them librosa, the reference the tests check the mels
against (the services compute them in numpy and scipy: services/media/mel_filters.py says why). The
gateway and the render workers run no model, so theirs also leave out torch and what only torch
needs, the ONNX export tools and scipy (mel windows come from the audio service). The audio and live
images leave out torch too: their mel pipeline is numpy and scipy. diffusers (the MuseTalk tier's UNet
and VAE) and what only it requires go into the lipsync image alone; transformers is a test tool.

Only the GPU images (the stages with `gpu` in services/serving/stages.py, the registry: lipsync and
superres; `gpu` > 0 in the chart, RUNTIME=gpu in the Dockerfile) get
NVML's bindings, and `--check` there also wants what torch.compile needs at run time: a C compiler
(`cc`) and the Python headers (Triton builds its launcher with them). A GPU-only package that is not
in the lock is not an error here (the lock is the lock), but `--check` fails the GPU image without it.

The registry is standard library too: the Dockerfile copies it in before this script runs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import re
import shutil
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python3 scripts/image_requirements.py`: the registry beside it
    sys.path.insert(0, str(REPO))

from services.serving.stages import image_stages

# Only the tests, the chart checks and the build need these.
DEV = frozenset(
    {
        "pytest",
        "pytest-timeout",
        "pytest-xdist",
        "execnet",
        "iniconfig",
        "pluggy",
        "pygments",
        "hypothesis",
        "sortedcontainers",
        "ruff",
        "mypy",
        "mypy-extensions",
        "librt",
        "ast-serialize",
        "pathspec",
        "grpcio-tools",
        "jsonschema",
        "jsonschema-specifications",
        "referencing",
        "rpds-py",
        "kubernetes-validate",
        "importlib-resources",
        # the browser tests (tests/integration/test_web.py) and what only Playwright requires
        "playwright",
        "greenlet",
        # bench/autoscale.py's plot (optional there: JSON without it); its pillow is in DIFFUSERS
        "matplotlib",
        "contourpy",
        "cycler",
        "fonttools",
        "kiwisolver",
        "pyparsing",
        # librosa: the reference the tests check the mels and the mel filter bank against (the services
        # never import it), and what only it requires
        "librosa",
        "audioread",
        "decorator",
        "joblib",
        "lazy-loader",
        "llvmlite",
        "msgpack",
        "narwhals",
        "numba",
        "pooch",
        "platformdirs",
        "scikit-learn",
        "soundfile",
        "soxr",
        "threadpoolctl",
        "cffi",
        "pycparser",
        # transformers: the reference the tests check the MuseTalk tier's whisper encoder and log-mel
        # against, and what only it requires
        "transformers",
        "tokenizers",
        "kernels",
        "tomlkit",
        "typer",
        "rich",
        "markdown-it-py",
        "mdurl",
        "shellingham",
        "annotated-doc",
        # the LiveKit integration's tests (clients/livekit: livekit-agents in the lock) and what only it requires
        "livekit",
        "livekit-agents",
        "livekit-api",
        "livekit-blingfire",
        "livekit-local-inference",
        "livekit-protocol",
        "aiofiles",
        "docstring-parser",
        "eval-type-backport",
        "jiter",
        "json-repair",
        "nest-asyncio",
        "openai",
        "psutil",
        "pyjwt",
        "sniffio",
        "sounddevice",
        "types-protobuf",
        "watchfiles",
    }
)
# torch and the packages in the lock that only torch requires.
TORCH = frozenset({"torch", "sympy", "mpmath", "networkx", "filelock", "fsspec", "jinja2", "markupsafe"})
# `python -m services.<stage>.export`: ONNX export and its onnxruntime check (GPU stages only).
ONNX = frozenset({"onnx", "onnxruntime", "ml-dtypes", "flatbuffers"})
# The mels' STFT and the live worker's resampling filter (services/media/mel.py, services/live/resample.py):
# the audio and live images only (tests/unit/test_images.py checks no other image's code imports it).
SCIPY = frozenset({"scipy"})

# The MuseTalk tier's UNet and VAE (services/lipsync/musetalk): diffusers and what only it requires at
# run time (pillow also serves the dev tools' matplotlib). The lipsync image only.
DIFFUSERS = frozenset(
    {
        "diffusers",
        "huggingface-hub",
        "hf-xet",
        "httpx2",
        "httpcore2",
        "h11",
        "anyio",
        "truststore",
        "click",
        "tqdm",
        "importlib-metadata",
        "zipp",
        "lazy-importer",
        "regex",
        "safetensors",
        "pillow",
    }
)

# NVML's Python bindings (`import pynvml`, services/serving/metrics.py): the GPU metrics, GPU images only.
GPU_ONLY = frozenset({"nvidia-ml-py"})
# The images that run on a GPU (the registry's; the chart's stages with `gpu` > 0, tests/unit/serving/test_stages.py checks).
GPU_SERVICES = frozenset(image_stages(gpu=True))

EXCLUDED: dict[str, frozenset[str]] = {
    "audio": DEV | TORCH | ONNX | DIFFUSERS,
    "lipsync": DEV | SCIPY,
    "superres": DEV | DIFFUSERS | SCIPY,
    "gateway": DEV | TORCH | ONNX | SCIPY | DIFFUSERS,
    "render": DEV | TORCH | ONNX | SCIPY | DIFFUSERS,
    # The live worker's incremental mel is services/media/mel.py: scipy stays; no torch, no ONNX.
    "live": DEV | TORCH | ONNX | DIFFUSERS,
    # The web page: aiohttp, grpc and protobuf over the gateway; no model, no media decoding.
    "web": DEV | TORCH | ONNX | SCIPY | DIFFUSERS,
}
# One entry per image (a stage that runs another's image, lipsync-musetalk the lipsync one, has none).
if set(EXCLUDED) != set(image_stages()):  # a stage joined or left the registry: say what its image leaves out
    raise SystemExit(f"{__file__}: EXCLUDED has {sorted(EXCLUDED)}, the registry's images {sorted(image_stages())}")
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


def runtime(service: str) -> str:
    """`gpu` or `cpu`: the Dockerfile's RUNTIME for this service's image."""
    return "gpu" if service in GPU_SERVICES else "cpu"


def left_out(service: str) -> frozenset[str]:
    """Every package of the lock this service's image does not install."""
    if service not in EXCLUDED:
        raise SystemExit(f"unknown service {service!r}: one of {', '.join(EXCLUDED)}")
    return EXCLUDED[service] | (frozenset() if service in GPU_SERVICES else GPU_ONLY)


def requirements(service: str, lock: Path) -> list[str]:
    """The lock's lines this service's image installs."""
    leave_out = left_out(service)
    pinned = lock_lines(lock)
    unknown = EXCLUDED[service] - {name for name, _ in pinned}
    if unknown:  # a package left the lock: keep these lists honest
        raise SystemExit(f"excluded for {service} but not in {lock}: {sorted(unknown)}")
    return [line for name, line in pinned if name not in leave_out]


def check_installed(service: str) -> list[str]:
    """Excluded packages that are installed in this environment anyway (should be none)."""
    installed = {normalize(d.metadata["Name"]) for d in importlib.metadata.distributions()}
    return sorted(left_out(service) & installed)


def gpu_problems(
    installed: set[str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
    include_dir: str | None = None,
) -> list[str]:
    """What a GPU image lacks for NVML and torch.compile (empty when complete). The arguments stand in
    for this environment in tests: installed distribution names, shutil.which, the Python headers' folder."""
    here = installed is None
    if installed is None:
        installed = {normalize(d.metadata["Name"]) for d in importlib.metadata.distributions()}
    problems = [
        f"{name} is not installed (NVML: the GPU metrics; add it to requirements.lock)"
        for name in sorted(GPU_ONLY - installed)
    ]
    if here and not problems and importlib.util.find_spec("pynvml") is None:
        problems.append("nvidia-ml-py is installed but `import pynvml` finds nothing")
    if which("cc") is None:
        problems.append("no C compiler `cc` (Triton builds its launcher with it: apt-get install gcc)")
    include = Path(include_dir if include_dir is not None else sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        problems.append(f"no Python headers ({include}/Python.h; apt-get install python3-dev)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("service", choices=list(image_stages()))
    parser.add_argument("lock", nargs="?", type=Path, default=REPO / "requirements.lock")
    parser.add_argument(
        "--check",
        action="store_true",
        help="fail if an excluded package is installed here, or (GPU images) NVML, cc or Python.h is missing",
    )
    parser.add_argument(
        "--runtime", choices=["gpu", "cpu"], help="fail unless this is the service's RUNTIME (Dockerfile)"
    )
    args = parser.parse_args(argv)
    if args.runtime is not None:
        if args.runtime != runtime(args.service):
            print(
                f"lipline-{args.service} is built with RUNTIME={runtime(args.service)}, not {args.runtime}",
                file=sys.stderr,
            )
            return 1
        return 0
    if args.check:
        failed = False
        present = check_installed(args.service)
        if present:
            print(
                f"lipline-{args.service} must not contain {', '.join(present)} (a kept package requires it?)",
                file=sys.stderr,
            )
            failed = True
        if args.service in GPU_SERVICES:
            for problem in gpu_problems():
                print(f"lipline-{args.service}: {problem}", file=sys.stderr)
                failed = True
        return 1 if failed else 0
    print("\n".join(requirements(args.service, args.lock)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
