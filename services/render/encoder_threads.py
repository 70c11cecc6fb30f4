"""How many x264 threads one encoder should use in this process."""

from __future__ import annotations

import os

MAX_X264_THREADS = 4  # a render worker is one process per few cores; more threads add latency, not speed


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which a container's cpuset narrows), not the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 2


def x264_threads() -> int:
    return max(1, min(MAX_X264_THREADS, usable_cpus()))
