"""The CPU stages' native pools (OpenBLAS, OpenMP, OpenCV) run one thread per process; the GPU stages
keep the libraries' defaults; an operator's variable wins. Checked in fresh interpreters, since the
libraries read their variables when they load."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from services.local.cluster import REPO_ROOT
from services.serving.native_threads import THREAD_VARIABLES

PROBE = """
import json, sys, importlib
importlib.import_module(sys.argv[1])  # the stage's __main__ module, imported (not run)
import cv2, threadpoolctl
from services.serving import native_threads
native_threads.apply_opencv_threads()  # what server.run does first
blas = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
print(json.dumps({"blas": blas, "opencv": cv2.getNumThreads()}))
"""


def probe(module: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        cwd=REPO_ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stage", ["render", "gateway", "audio"])
def test_cpu_stages_run_one_native_thread(stage: str) -> None:
    got = probe(f"services.{stage}.__main__")
    assert got["blas"] and set(got["blas"]) == {1}, got
    assert got["opencv"] == 1, got


def test_an_operators_setting_wins() -> None:
    got = probe("services.render.__main__", OPENBLAS_NUM_THREADS="2", OPENCV_FOR_THREADS_NUM="2")
    assert set(got["blas"]) == {2} and got["opencv"] == 2, got


def test_gpu_stages_keep_the_defaults() -> None:
    got = probe("services.superres.__main__")
    assert got["opencv"] == cv2_default(), got
    if len(os.sched_getaffinity(0)) > 1:
        assert max(got["blas"]) > 1, got


def cv2_default() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import cv2; print(cv2.getNumThreads())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES},
    )
    return int(done.stdout)
