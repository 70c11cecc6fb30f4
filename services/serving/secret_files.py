"""Secret files re-read when they change, so keys rotate without a restart.

Kubernetes updates a mounted Secret in place (kubelet swaps the volume's `..data` symlink to a new
folder within its sync period, about a minute), so a process that read its API keys once keeps
accepting a revoked key until it restarts. `watch_secret_file` polls the file's identity (inode,
size, modification time, through the symlink) every `every_s` and, when it changed, parses it again
and hands the result over; a file that no longer parses (a half-written edit, a bad line) is refused
with an ERROR naming the file and the problem (never its content), and the last good value stays:
a typo must never lock every caller out.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TypeVar

from services.serving.auth import read_secret_file
from services.serving.metrics import Metrics

_LOGGER = logging.getLogger(__name__)
T = TypeVar("T")
Stamp = tuple[int, int, int] | None


def file_stamp(path: str) -> Stamp:
    """What changes when the file is replaced or rewritten: inode, size, mtime (None when it is missing)."""
    try:
        st = os.stat(path)  # follows symlinks: a swapped ..data link is a new inode
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


async def watch_secret_file(
    path: str,
    what: str,
    parse: Callable[[str], T],
    apply: Callable[[T], None],
    every_s: float,
    counted: Callable[[str], None] = lambda result: None,
) -> None:
    """Until cancelled: every `every_s`, when `path` changed since the last look, `apply(parse(text))`;
    `counted` hears "reloaded" or "refused" each time (a metric)."""
    stamp = file_stamp(path)
    while True:
        await asyncio.sleep(every_s)
        now = file_stamp(path)
        if now == stamp:
            continue
        stamp = now
        try:
            value = parse(await asyncio.to_thread(read_secret_file, path, what))
        except ValueError as exc:
            counted("refused")
            _LOGGER.error("the %s changed but cannot be used; the previous one stays in force: %s", what, exc)
            continue
        apply(value)
        counted("reloaded")
        _LOGGER.info("the %s changed: reloaded", what, extra={"file": path})


def start_watch(
    path: str,
    what: str,
    parse: Callable[[str], T],
    apply: Callable[[T], None],
    every_s: float,
    metrics: Metrics,
    label: str,
) -> asyncio.Task | None:
    """`watch_secret_file` as a task of the running loop, counted in `lipline_secret_reloads_total{file=label}`;
    None when there is no file or reloading is off (`every_s` 0). Stop it with cancel_and_wait."""
    if not path or every_s <= 0:
        return None
    return asyncio.create_task(
        watch_secret_file(
            path, what, parse, apply, every_s, lambda result: metrics.secret_reloads.labels(label, result).inc()
        ),
        name=f"lipline-{label}-watch",
    )
