#!/usr/bin/env python
"""CPU per live session, one thread: what `services.live.session.LiveSession` costs per second of speech.

One session at --size runs --seconds of samples/speech.wav (resampled to --rate, sent in 20 ms chunks)
on a fake clock that moves 20 ms per chunk, so the run takes only the CPU time the work needs (no
sleeping): the incremental mel, the speech queue, the compositor and the encoder, with a stand-in face
generator (a flat face; the lipsync stage's own cost is on the GPU and not counted). The face box is
the avatar's central lower third. A first, unmeasured run pays the one-off costs (caches, first
calls). Prints per encoder the CPU ms per session-second and the sessions one core holds at that rate
(1000 / ms), and one JSON line.

Example:
    python bench/bench_live_session.py                          # 512x512, 16 kHz, ultrafast, veryfast, JPEG
    python bench/bench_live_session.py --size 1280x720 --rate 48000
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import wave
from fractions import Fraction
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO_ROOT))

import cv2
import numpy as np
from scipy.signal import resample_poly

from services.live.clock import FrameClock
from services.live.encoders import H264Encoder, JpegEncoder
from services.live.idle import IdleLoop
from services.live.session import LiveSession
from services.media.composite import Compositor, I420Frames


def speech(rate: int, seconds: float) -> np.ndarray:
    with wave.open(str(REPO_ROOT / "samples" / "speech.wav")) as wav:
        source_rate = wav.getframerate()
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.float64)
    g = math.gcd(rate, source_rate)
    pcm = resample_poly(pcm, rate // g, source_rate // g)
    pcm = np.tile(pcm, math.ceil(seconds * rate / len(pcm)))[: int(seconds * rate)]
    return np.round(pcm).clip(-32768, 32767).astype("<i2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--size", default="512x512")
    parser.add_argument("--rate", type=int, default=16000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--fps", type=int, default=25)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    cv2.setNumThreads(1)
    base = cv2.resize(
        cv2.imread(str(REPO_ROOT / "samples" / "avatar.jpg")), (width, height), interpolation=cv2.INTER_AREA
    )
    frames = I420Frames.from_bgr([np.roll(base, s, axis=1) for s in range(0, 20, 4)])
    box = (width // 3 // 2 * 2, height // 3 // 2 * 2, 2 * width // 3 // 2 * 2, 7 * height // 8 // 2 * 2)
    face = np.full((box[3] - box[1], box[2] - box[0], 3), 128, np.uint8)
    pcm = speech(args.rate, args.seconds)
    chunk = args.rate // 50
    fps = Fraction(args.fps)
    encoders = {
        "h264 ultrafast": lambda: H264Encoder(width, height, fps, preset="ultrafast"),
        "h264 veryfast": lambda: H264Encoder(width, height, fps, preset="veryfast"),
        "jpeg q80": lambda: JpegEncoder(width, height, 80),
    }
    rows = []
    for name, make in [
        ("warm-up", encoders["jpeg q80"]),
        *encoders.items(),
    ]:  # the first run pays one-off costs (caches, imports)
        now = [0]
        session = LiveSession(
            IdleLoop(frames),
            Compositor(frames, [box] * frames.count),
            make(),
            FrameClock(fps, lambda: now[0]),
            lambda t, w: face,
            args.rate,
        )
        t0 = time.process_time()
        for i in range(0, len(pcm), chunk):
            now[0] += 20_000_000
            session.push_audio(pcm[i : i + chunk].tobytes())
            session.tick()
        cpu = time.process_time() - t0
        ms = 1000 * cpu / args.seconds
        counts = session.counts
        if name == "warm-up":
            continue
        rows.append(
            {
                "encoder": name,
                "cpu_ms_per_session_second": ms,
                "sessions_per_core": 1000 / ms,
                "speech": counts.speech,
                "idle": counts.idle,
            }
        )
    print(f"{width}x{height}, {args.rate} Hz in, {args.fps} fps, {args.seconds:.0f} s of speech, one thread")
    print("| encoder | CPU ms per session-second | sessions per core |\n| --- | --- | --- |")
    for r in rows:
        print(f"| {r['encoder']} | {r['cpu_ms_per_session_second']:.1f} | {r['sessions_per_core']:.1f} |")
    print(json.dumps({"size": args.size, "rate": args.rate, "rows": rows}))


if __name__ == "__main__":
    main()
