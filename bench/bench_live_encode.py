#!/usr/bin/env python
"""Per-frame encode cost of a live session, one thread: x264 zerolatency presets against OpenCV JPEG.

The frames are samples/avatar.jpg (scaled to --size) with a changing mouth region (noise over the
lower middle of the frame, every frame different: the worst case for x264, as issue 19's figures),
fed as I420 (what the compositor writes) to `services.live.encoders`. Each encoder runs --frames
frames on one thread (cv2.setNumThreads(1), x264 threads=1): the numbers are per core. Prints a
markdown table (ms per frame, frames per second per core, mean bytes per frame, keyframes included)
and one JSON line.

Example:
    python bench/bench_live_encode.py                      # 512x512, ultrafast, veryfast and JPEG
    python bench/bench_live_encode.py --size 1280x720 --frames 200
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from fractions import Fraction
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO_ROOT))

import cv2
import numpy as np

from services.live.encoders import H264Encoder, JpegEncoder
from services.media.video_format import to_yuv420


def frames(width: int, height: int, count: int) -> list[np.ndarray]:
    """I420 frames of the sample avatar with a mouth region of fresh noise in each."""
    base = cv2.resize(
        cv2.imread(str(REPO_ROOT / "samples" / "avatar.jpg")), (width, height), interpolation=cv2.INTER_AREA
    )
    rng = np.random.default_rng(0)
    y0, y1, x0, x1 = int(height * 0.6), int(height * 0.8), int(width * 0.35), int(width * 0.65)
    out = []
    for _ in range(count):
        frame = base.copy()
        frame[y0:y1, x0:x1] = rng.integers(0, 256, (y1 - y0, x1 - x0, 3), dtype=np.uint8)
        out.append(to_yuv420(frame))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--size", default="512x512")
    parser.add_argument("--frames", type=int, default=250)
    parser.add_argument("--fps", type=int, default=25)
    parser.add_argument("--presets", default="ultrafast,veryfast")
    parser.add_argument("--jpeg-quality", type=int, default=80)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    cv2.setNumThreads(1)
    inputs = frames(width, height, args.frames)
    encoders = {
        f"h264 {p}": (lambda p=p: H264Encoder(width, height, Fraction(args.fps), preset=p))
        for p in args.presets.split(",")
    }
    encoders[f"jpeg q{args.jpeg_quality}"] = lambda: JpegEncoder(width, height, args.jpeg_quality)
    rows = []
    for name, make in encoders.items():
        encoder = make()
        encoder.encode(inputs[0], 0)  # warm-up
        sizes = []
        t0 = time.perf_counter()
        for k, frame in enumerate(inputs, start=1):
            sizes.append(len(encoder.encode(frame, k).data))
        seconds = time.perf_counter() - t0
        encoder.close()
        per_frame = seconds / len(inputs)
        rows.append(
            {
                "encoder": name,
                "ms_per_frame": 1000 * per_frame,
                "fps_per_core": 1 / per_frame,
                "bytes_per_frame": float(np.mean(sizes)),
            }
        )
    print(f"{width}x{height}, {args.frames} frames, one thread, {platform.processor() or platform.machine()}")
    print("| encoder | ms/frame | frames/s per core | bytes/frame |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['encoder']} | {r['ms_per_frame']:.2f} | {r['fps_per_core']:.0f} | {r['bytes_per_frame']:.0f} |")
    print(json.dumps({"size": args.size, "frames": args.frames, "rows": rows}))


if __name__ == "__main__":
    main()
