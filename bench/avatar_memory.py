#!/usr/bin/env python
"""Peak memory of CreateAvatar and a first render for short and long video avatars (issue 17, item 3).

Starts the services as processes (services.local.LocalCluster, one render worker), then per avatar
length: resets the peak RSS of the gateway, the lipsync stage and the render worker (writing 5 to
/proc/<pid>/clear_refs resets VmHWM to the current RSS), creates a static video avatar (the sample
face scaled into a --width x --height frame, --frames frames encoded with PyAV's H.264, a few KiB
per second), renders a --audio-seconds job on it, and reports each process's peak RSS increase
(VmHWM after - VmRSS before). Memory must follow the frames in flight, not the avatar's length:
the longest avatar's increases should be within 2x the shortest's.

Examples:
    # the figures in docs/performance.md ("Avatar memory")
    python bench/avatar_memory.py --width 1920 --height 1080 --frames 150,1500
    # quick (tests/integration/test_avatar_memory.py runs this at 720p, 30 vs 300 frames)
    python bench/avatar_memory.py --width 1280 --height 720 --frames 30,300
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import av
import cv2
import numpy as np

from services.local.cluster import LocalCluster
from services.media.audio import decode_audio

SAMPLES = REPO / "samples"
PROCESSES = ("gateway", "lipsync", "render")


def static_video(frames: int, width: int, height: int, fps: int = 25) -> bytes:
    """A static picture with a face (samples/avatar.jpg scaled to the frame's height) as an H.264 MP4."""
    photo = cv2.imread(str(SAMPLES / "avatar.jpg"))
    scale = height / photo.shape[0]
    face = cv2.resize(photo, (min(width, round(photo.shape[1] * scale)), height), interpolation=cv2.INTER_AREA)
    canvas = np.full((height, width, 3), 120, np.uint8)
    x0 = (width - face.shape[1]) // 2
    canvas[:, x0 : x0 + face.shape[1]] = face
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "23"}
        picture = av.VideoFrame.from_ndarray(canvas, format="bgr24")
        for i in range(frames):
            picture.pts = i
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
    return out.getvalue()


def speech_wav(seconds: float) -> bytes:
    """samples/speech.wav cut to ``seconds`` (16-bit mono WAV)."""
    import wave

    audio = decode_audio((SAMPLES / "speech.wav").read_bytes(), 16000)[: round(seconds * 16000)]
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} for process {pid}")


def reset_peak(pid: int) -> int:
    """Resets the process's VmHWM to its current RSS; returns that RSS in KiB."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _status_kib(pid, "VmRSS")


def measure(cluster: LocalCluster, data: bytes, audio: bytes, timeout: float = 600.0) -> dict:
    """Peak RSS increase (MiB) of each process over CreateAvatar of ``data`` and one job on it."""
    from services.gateway.client import LiplineClient

    pids = {name: cluster.processes[name].process.pid for name in PROCESSES}
    before = {name: reset_peak(pid) for name, pid in pids.items()}
    client = LiplineClient(cluster.gateway_address, timeout=timeout)
    try:
        started = time.monotonic()
        avatar = client.create_avatar(data)
        created = time.monotonic() - started
        job = client.wait(client.submit_job(avatar.id, audio).id)
        rendered = time.monotonic() - started - created
    finally:
        client.close()
    peaks = {name: (_status_kib(pid, "VmHWM") - before[name]) / 1024 for name, pid in pids.items()}
    cache = sorted((cluster.workdir).rglob(f"{avatar.id}.i420.npy"))
    return {
        "frames": avatar.frame_count,
        "size": f"{avatar.width}x{avatar.height}",
        "upload_kib": round(len(data) / 1024, 1),
        "create_s": round(created, 1),
        "render_s": round(rendered, 1),
        "job_state": int(job.state),
        "peak_increase_mib": {k: round(v, 1) for k, v in peaks.items()},
        "i420_cache_mib": round(cache[0].stat().st_size / 2**20, 1) if cache else None,
    }


def run(frames: list[int], width: int, height: int, audio_seconds: float, workdir: Path) -> list[dict]:
    audio = speech_wav(audio_seconds)
    with LocalCluster(workdir, replicas={"render": 1}) as cluster:
        return [measure(cluster, static_video(n, width, height), audio) for n in frames]


def table(results: list[dict]) -> str:
    lines = [
        "| avatar | upload | CreateAvatar | gateway peak + | lipsync peak + | render worker peak + | worker I420 cache (disk) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        p = r["peak_increase_mib"]
        lines.append(
            f"| {r['frames']} frames {r['size']} | {r['upload_kib']} KiB | {r['create_s']} s | {p['gateway']:.0f} MiB | "
            f"{p['lipsync']:.0f} MiB | {p['render']:.0f} MiB | {r['i420_cache_mib']} MiB |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--frames", default="150,1500", help="avatar lengths, comma-separated")
    parser.add_argument("--audio-seconds", type=float, default=1.0)
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="avatar-memory-") as folder:
        results = run(
            [int(n) for n in args.frames.split(",")], args.width, args.height, args.audio_seconds, Path(folder)
        )
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
