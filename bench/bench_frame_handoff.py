#!/usr/bin/env python
"""CPU per output frame of a render worker's encoder thread: blend the face into the cached I420
frame and hand the frame to x264, at 720p, with x264 on one thread so the process's CPU time is
all of it.

Why: on the H200 host the render workers are the CPU bottleneck and a py-spy profile put
`av.VideoFrame.from_ndarray` (a fresh 1.4 MB frame allocated and copied per output frame) at 11-14 %
of the encoder thread's samples. This measures what the code in this tree does: the compositor
writing straight into the encoder's reused frame (`Compositor.frame_into` + `Mp4Writer.write_planes`)
where the tree has them, else the older path (`Compositor.frame` + `Mp4Writer.write_yuv420`), so
running it on two checkouts compares them on one machine.

Example:
    python bench/bench_frame_handoff.py --frames 300 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np

from services.media.composite import Compositor, I420Frames
from services.render.mp4 import Mp4Writer


def avatar(count: int, width: int, height: int) -> np.ndarray:
    """`count` BGR template frames: a gradient with a slowly moving textured block."""
    rng = np.random.default_rng(0)
    base = np.repeat(np.linspace(40, 200, width, dtype=np.uint8)[None, :, None], height, axis=0).repeat(3, axis=2)
    block = rng.integers(0, 255, (height // 3, width // 5, 3), np.uint8)
    frames = []
    for i in range(count):
        frame = base.copy()
        x = width // 2 + int(10 * np.sin(i / 5))
        frame[height // 5 : height // 5 + block.shape[0], x : x + block.shape[1]] = block
        frames.append(frame)
    return np.stack(frames)


def run(frames: int, width: int, height: int, preset: str) -> tuple[float, str]:
    """(CPU seconds per frame of this process, the path measured) for one encoded clip."""
    template = avatar(25, width, height)
    box = (width // 3, height // 4, width // 3 + 360, height // 4 + 400)
    compositor = Compositor(I420Frames.from_bgr(template), [box] * len(template))
    rng = np.random.default_rng(1)
    faces = [rng.integers(0, 255, (400, 360, 3), np.uint8) for _ in range(8)]
    in_place = hasattr(Mp4Writer, "write_planes") and hasattr(compositor, "frame_into")
    with tempfile.TemporaryDirectory(prefix="bench-handoff-") as tmp:
        t0 = time.process_time()
        with Mp4Writer(Path(tmp) / "clip.mp4", width, height, 25.0, None, 48_000, preset=preset, threads=1) as writer:
            for i in range(frames):
                face = faces[i % len(faces)] if i % 10 else None  # every tenth frame without a face
                if in_place:
                    compositor.frame_into(i % len(template), face, writer.i420_planes())
                    writer.write_planes()
                else:
                    writer.write_yuv420(compositor.frame(i % len(template), face, copy=False))
        cpu = time.process_time() - t0
    return cpu / frames, "frame_into + write_planes" if in_place else "frame + write_yuv420"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--preset", default="veryfast")
    args = p.parse_args(argv)
    results = [run(args.frames, args.width, args.height, args.preset) for _ in range(args.rounds)]
    per_frame = sorted(r[0] * 1000 for r in results)
    print(
        f"{results[0][1]}: CPU ms per {args.width}x{args.height} frame (x264 {args.preset}, 1 thread), "
        f"rounds {', '.join(f'{v:.2f}' for v in per_frame)}; median {per_frame[len(per_frame) // 2]:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
