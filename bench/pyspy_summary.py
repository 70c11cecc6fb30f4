"""A py-spy raw profile (`py-spy record --threads -f raw`) summarised: busy samples per thread, then
the functions that hold them, by self time and by inclusive time.

Why: a flame graph needs a browser and cannot go in docs/performance.md; the few lines that say where
a live worker's CPU goes can. Samples in the idle waits (the event loop's epoll, an idle executor
thread, gRPC's poller) are left out, so the counts are CPU, not wall time.

    python bench/pyspy_summary.py live-raw.txt --top 25
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

# Leaves that are waits: the selector's epoll, an executor thread blocked on its queue (the line is
# 81 on Python 3.11, 89 on 3.12: hence the prefix), a thread parked in Thread.run (gRPC's poller).
IDLE_LEAVES = ("EpollSelector.select", "_worker (concurrent/futures/thread.py:8", "Thread.run (threading.py")
RUNTIME_FRAMES = ("runpy>", "threading.py", "asyncio/runners.py", "run_until_complete", "run_forever", "__main__.py")


def summarise(path: Path, top: int) -> str:
    threads: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not stack or frames[-1].startswith(IDLE_LEAVES):
            continue
        n = int(count)
        threads[frames[0]] += n
        leaves[frames[-1]] += n
        for frame in set(frames[1:]):
            if not any(part in frame for part in RUNTIME_FRAMES):
                inclusive[frame] += n
    total = sum(threads.values())
    lines = [f"busy samples: {total}", "", "| thread | samples | share |", "|---|---:|---:|"]
    lines += [f"| {name} | {n} | {n / total:.0%} |" for name, n in threads.most_common(8)]
    for title, table in (("self", leaves), ("inclusive", inclusive)):
        lines += ["", f"| function ({title}) | samples | share |", "|---|---:|---:|"]
        lines += [f"| {name} | {n} | {n / total:.0%} |" for name, n in table.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw", type=Path, help="py-spy record --threads -f raw output")
    p.add_argument("--top", type=int, default=25, help="functions listed per table")
    args = p.parse_args()
    print(summarise(args.raw, args.top))


if __name__ == "__main__":
    main()
