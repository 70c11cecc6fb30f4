#!/usr/bin/env python
"""CPU seconds of the render workers by thread role during a `bench_e2e.py` burst: each worker's
asyncio main thread, its encoder thread and x264's threads (they run at the worker's
`encode_nice`, 5 by default), and the other threads (the AAC task, store and blob calls).

Why: a render worker's CPU is all that limits the burst on one GPU host, and `bench_e2e.py`
reports it per process only. Threads are read from /proc every 50 ms between the log's "jobs, at
most" line (the measured burst starts) and its "jobs/min" line; a thread's CPU is its last reading
minus its first, so threads that end between two readings lose at most 50 ms each (x264's threads
end with each segment).

Example (beside a running bench, same log):
    python bench/bench_e2e.py --device cuda --jobs 16 --worker-counts 32 ... > e2e.log 2>&1 &
    python bench/render_thread_cpu.py e2e.log
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path


def worker_threads() -> dict[tuple[str, str], tuple[str, float]]:
    """(pid, tid) -> (role, CPU seconds so far) for every thread of every render worker."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in subprocess.run(["pgrep", "-f", "services.render"], capture_output=True, text=True).stdout.split():
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            role = "main" if task.name == pid else ("encode (nice > 0)" if int(fields[16]) > 0 else "other")
            found[(pid, task.name)] = (role, (int(fields[11]) + int(fields[12])) / tick)
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", type=Path, help="bench_e2e.py's output, being written")
    p.add_argument("--interval", type=float, default=0.05)
    args = p.parse_args(argv)
    while not args.log.exists() or "jobs, at most" not in args.log.read_text():
        time.sleep(0.1)
    first: dict[tuple[str, str], float] = {}
    last: dict[tuple[str, str], tuple[str, float]] = {}
    while "jobs/min" not in args.log.read_text():
        for key, (role, cpu) in worker_threads().items():
            first.setdefault(key, cpu)
            last[key] = (role, cpu)
        time.sleep(args.interval)
    by_role: dict[str, float] = {}
    for key, (role, cpu) in last.items():
        by_role[role] = by_role.get(role, 0.0) + cpu - first[key]
    print(json.dumps({role: round(cpu, 2) for role, cpu in sorted(by_role.items())}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
