"""`--warm-cache-only`: what the chart's compile-cache Job runs (compileCache.warmJob). The stage loads,
compiles and warms its model, saves the artifacts and exits 0 without serving; a later start with
`--backend auto` on that cache picks the compiled backend. Real processes, on the CPU (Inductor's C++
backend), with the weight-free procedural model at one batch size to keep the compile short."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.local.cluster import REPO_ROOT


def lipsync(*flags: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "services.lipsync", "--device=cpu", "--max-batch=1", "--log-format=text", *flags],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_warm_cache_only_fills_the_cache_and_exits(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    port_file = tmp_path / "port"  # written once a service is SERVING: a warm-only run never is
    done = lipsync(
        "--backend=compile",
        "--warm-cache-only=true",
        f"--compile-cache-dir={cache}",
        "--port=0",
        f"--port-file={port_file}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compile cache filled" in done.stderr and "listening" not in done.stderr
    assert not port_file.exists()
    (artifact,) = list(cache.iterdir())
    assert artifact.stat().st_size > 0


def test_warm_cache_only_needs_the_compile_backend(tmp_path: Path) -> None:
    done = lipsync("--backend=auto", "--warm-cache-only=true", timeout=60)
    assert done.returncode != 0
    assert "warm_cache_only fills the compile cache: it needs backend=compile" in done.stderr
