#!/usr/bin/env python
"""H.264 encoding throughput of the render workers' writer (services.render.mp4.Mp4Writer), without the stages.

Why: on the H200 host the 60 s 720p job spent 3.5 ms per frame in the encoder thread with x264's
`veryfast` and `superfast` presets alike, which says the limit is not x264's own work. This runs
the same writer on synthetic frames (a face-like patch moving on a gradient, pre-converted to I420
the way the compositor threads hand frames over) and reports frames/s per preset and x264 thread
count, and with --parallel P also P writers on P threads at once (P segments of one clip, or P
jobs): if P writers give about P times the frames/s, segment-parallel encoding would pay off.

It is also the "x264 alone on the same cores" figure the scale-out table sets render jobs against
(bench/gpu_session.sh scaleout): one writer per core, --out writes the rows as JSON.

Example:
    python bench/bench_encode.py --frames 300 --presets veryfast,superfast --parallel 1,2,4
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np

from services.media.video_format import to_yuv420
from services.render.mp4 import Mp4Writer


def synthetic_frames(count: int, width: int, height: int) -> list[np.ndarray]:
    """I420 frames: a textured patch (the 'face') swaying on a horizontal gradient, 25 distinct ones reused."""
    rng = np.random.default_rng(0)
    base = np.repeat(np.linspace(40, 200, width, dtype=np.uint8)[None, :, None], height, axis=0).repeat(3, axis=2)
    patch = rng.integers(0, 255, (height // 2, width // 4, 3), np.uint8)
    distinct = []
    for i in range(min(count, 25)):
        frame = base.copy()
        x = width // 3 + int(8 * np.sin(i / 4))
        frame[height // 4 : height // 4 + patch.shape[0], x : x + patch.shape[1]] = patch
        distinct.append(to_yuv420(frame))
    return [distinct[i % len(distinct)] for i in range(count)]


def encode(path: Path, frames: list[np.ndarray], width: int, height: int, preset: str) -> float:
    """Seconds to encode `frames` into `path` (with 1 s of silent AAC per 25 frames, as a job has)."""
    audio = np.zeros(round(len(frames) / 25 * 48_000), np.float32)
    t0 = time.perf_counter()
    with Mp4Writer(path, width, height, 25.0, audio, 48_000, preset=preset) as writer:
        for frame in frames:
            writer.write_yuv420(frame)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--presets", default="veryfast,superfast")
    p.add_argument("--parallel", default="1,2", help="writers at once, each on its own thread and file")
    p.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    frames = synthetic_frames(args.frames, args.width, args.height)
    cpus = len(os.sched_getaffinity(0))
    rows = []
    print(f"{cpus} usable CPUs, {args.frames} frames of {args.width}x{args.height} per writer")
    print("| preset | writers at once | seconds | frames/s (all writers) | ms/frame per writer | MB per writer |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="bench-encode-") as tmp:
        for preset in args.presets.split(","):
            for parallel in (int(n) for n in args.parallel.split(",")):
                paths = [Path(tmp) / f"{preset}-{parallel}-{k}.mp4" for k in range(parallel)]
                t0 = time.perf_counter()
                with ThreadPoolExecutor(parallel) as pool:
                    took = list(pool.map(lambda path: encode(path, frames, args.width, args.height, preset), paths))
                wall = time.perf_counter() - t0
                size = sum(path.stat().st_size for path in paths) / parallel / 1e6
                row = {
                    "preset": preset,
                    "writers": parallel,
                    "seconds": wall,
                    "frames_per_s": parallel * args.frames / wall,
                    "ms_per_frame_per_writer": 1000 * float(np.mean(took)) / args.frames,
                    "mb_per_writer": size,
                }
                rows.append(row)
                print(
                    f"| {preset} | {parallel} | {wall:.2f} | {row['frames_per_s']:,.0f} | {row['ms_per_frame_per_writer']:.2f} | {size:.2f} |"
                )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        result = {
            "bench": "encode",
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "usable_cpus": cpus,
            "frames": args.frames,
            "width": args.width,
            "height": args.height,
            "rows": rows,
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
