"""One thread per native library pool in the CPU stages (render workers, gateway, audio).

OpenBLAS (numpy's), OpenMP and OpenCV each start a pool of one thread per CPU they see, and a
container sees the host's CPUs, not its quota. The CPU stages scale by processes (render workers:
one or two per core; audio and gateway replicas), so every pool is multiplied by the process count:
24 render workers on a 16-CPU host would carry 24 x 3 x 16 threads that spin between calls and take
the CPU x264 needs. Their parallelism is across processes and x264's own threads, so their native
pools get one thread. The GPU stages keep the libraries' defaults (their CPU work is one process
per GPU: batch preparation benefits from the pool).

`one_thread_per_process()` must run before numpy, OpenCV or torch is imported (OpenBLAS and OpenMP
read their variables when they load): the CPU stages' `__main__` call it first. Variables already
set win, so an operator can still give a process more threads. This module imports nothing heavy.
"""

from __future__ import annotations

import os
import sys

# The variables each library reads at load: OpenBLAS, OpenMP (GNU/Intel, and torch's intra-op pool),
# MKL, numexpr-style users of OMP; OpenCV's parallel_for backend.
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENCV_FOR_THREADS_NUM")


def one_thread_per_process() -> None:
    """Default every native pool of this process to one thread (unless its variable is set)."""
    for name in THREAD_VARIABLES:
        os.environ.setdefault(name, "1")


def apply_opencv_threads() -> None:
    """OpenCV also takes its pool size at run time; set it from OPENCV_FOR_THREADS_NUM once cv2 is
    loaded (some builds read the variable only for some backends)."""
    value = os.environ.get("OPENCV_FOR_THREADS_NUM", "")
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and value.isdigit():
        cv2.setNumThreads(int(value))
