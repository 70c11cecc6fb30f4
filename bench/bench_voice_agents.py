"""The voice-agent integrations' own cost on top of a live session: latency and CPU (docs/performance.md).

    .venv/bin/python bench/bench_voice_agents.py [--codec jpeg|h264] [--repeat 3]

Starts a local cluster (procedural lipsync on the CPU, one live worker), then, for each package, plays the
sample speech (1.2 s at 24 kHz) `--repeat` times through a real pipeline in real time:

- Pipecat: tests/helpers/pipecat_pipeline.py's `bench` scenario in .venv-pipecat (a PipelineWorker:
  TTS frames of 20 ms -> LiplineVideoService -> a sink).
- LiveKit: LiplineVideoGenerator under LiveKit Agents' AvatarRunner fed by a QueueAudioOutput, as in
  tests/integration/test_livekit.py (publishing into a room replaced by nothing: it needs a server).

Latency: for each speech frame k of an utterance, from the moment the TTS frame holding the end of k's
audio was pushed in to the moment k's picture came out of the package (decoded, RGB), p50/p95. It
contains lipline's own look-ahead (212.5 ms, docs/architecture.md section 10). CPU: the package's process
(Pipecat: the whole pipeline process; LiveKit: this process while the runner ran, the cluster apart),
CPU seconds per second of session.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.gateway.client import LiplineClient
from services.gateway.live_client import pcm_of_audio
from services.local.cluster import REPO_ROOT, LocalCluster

RATE, CHUNK_S = 24000, 0.02
SAMPLES = REPO_ROOT / "samples"


def cut(pcm: bytes, seconds: float) -> bytes:
    return pcm[: int(RATE * seconds) * 2]


def latencies(pushed: list[float], speech_out: list[list[float]], chunks: int, fps: float) -> list[float]:
    """Per speech frame: its picture out less the push of the TTS frame holding the end of its audio."""
    out = []
    for u, frames in enumerate(speech_out):
        base = u * chunks
        for j, t in enumerate(frames):
            chunk = min(chunks - 1, max(0, math.ceil((j + 1) / fps / CHUNK_S - 1e-9) - 1))
            if base + chunk < len(pushed):
                out.append(t - pushed[base + chunk])
    return out


def runs(flags: list[bool], times: list[float]) -> list[list[float]]:
    found, current = [], []
    for flag, t in zip([*flags, False], [*times, 0.0]):
        if flag:
            current.append(t)
        elif current:
            found.append(current)
            current = []
    return found


def bench_pipecat(address: str, avatar: str, speech: Path, args: argparse.Namespace, chunks: int) -> dict:
    python = REPO_ROOT / ".venv-pipecat" / "bin" / "python"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        cmd = [str(python), str(REPO_ROOT / "tests/helpers/pipecat_pipeline.py"), "bench", f"--address={address}"]
        cmd += [f"--avatar={avatar}", f"--speech={speech}", f"--codec={args.codec}", f"--repeat={args.repeat}"]
        subprocess.run([*cmd, f"--out={out}"], check=True, capture_output=True, timeout=600)
        record = json.loads((out / "record.json").read_text())
    speech_runs = runs(record["speech"], record["images"])
    lat = latencies(record["pushed"], speech_runs, chunks, 25.0)
    return {"latency": lat, "cpu_per_s": record["cpu_s"] / record["wall_s"], "frames": len(record["images"])}


async def bench_livekit(address: str, avatar: str, pcm: bytes, args: argparse.Namespace, chunks: int) -> dict:
    from livekit import rtc
    from livekit.agents.voice.avatar import AvatarRunner, QueueAudioOutput
    from livekit.plugins.lipline import LiplineVideoGenerator

    class RoomlessRunner(AvatarRunner):
        async def _publish_track(self) -> None:
            self._video_publication = True  # type: ignore[assignment]

    generator = await LiplineVideoGenerator.create(address, avatar, sample_rate=RATE, codec=args.codec)
    pictures: list[tuple[float, bool]] = []
    inner = generator._stream

    async def noted():  # type: ignore[no-untyped-def]  # each picture out, and whether speech audio followed it
        async for item in inner():
            if isinstance(item, rtc.VideoFrame):
                pictures.append((time.monotonic(), False))
            elif isinstance(item, rtc.AudioFrame) and pictures:
                pictures[-1] = (pictures[-1][0], True)
            yield item

    generator._stream = noted  # type: ignore[method-assign]
    output = QueueAudioOutput(sample_rate=RATE, wait_playback_start=True)
    runner = RoomlessRunner(rtc.Room(), audio_recv=output, video_gen=generator, options=generator.options)
    pushed: list[float] = []
    cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    await runner.start()
    await asyncio.sleep(0.5)
    for _ in range(args.repeat):
        started = time.monotonic()
        for i, at in enumerate(range(0, len(pcm), int(RATE * CHUNK_S) * 2)):
            part = pcm[at : at + int(RATE * CHUNK_S) * 2]
            pushed.append(time.monotonic())
            await output.capture_frame(rtc.AudioFrame(part, RATE, 1, len(part) // 2))
            await asyncio.sleep(max(0.0, started + (i + 1) * CHUNK_S - time.monotonic()))
        output.flush()
        await output.wait_for_playout()
        await asyncio.sleep(0.5)
    cpu1, wall1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    await runner.aclose()
    await generator.aclose()
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    lat = latencies(pushed, runs([s for _, s in pictures], [t for t, _ in pictures]), chunks, 25.0)
    return {"latency": lat, "cpu_per_s": cpu / (wall1 - wall0), "frames": len(pictures)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codec", default="jpeg", choices=["jpeg", "h264"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        extra = {"live": ["--superres-address="]}
        with LocalCluster(Path(tmp) / "cluster", replicas={"render": 0, "live": 1}, extra_args=extra) as cluster:
            with LiplineClient(cluster.gateway_address, timeout=120) as client:
                avatar = client.create_avatar((SAMPLES / "avatar.jpg").read_bytes(), name="bench").id
            pcm = cut(pcm_of_audio((SAMPLES / "speech.wav").read_bytes(), RATE), 1.2)
            speech = Path(tmp) / "speech.pcm"
            speech.write_bytes(pcm)
            chunks = math.ceil(len(pcm) / (int(RATE * CHUNK_S) * 2))
            results = {
                "pipecat": bench_pipecat(cluster.gateway_address, avatar, speech, args, chunks),
                "livekit": asyncio.run(bench_livekit(cluster.gateway_address, avatar, pcm, args, chunks)),
            }
    print(f"{platform.processor() or platform.machine()}, {args.codec}, 512x512 at 25 fps, {args.repeat} x 1.2 s")
    print("| package | speech frames | latency p50 | p95 | CPU per session-second |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        lat = np.array(r["latency"]) * 1000
        print(
            f"| {name} | {len(lat)} | {np.percentile(lat, 50):.0f} ms | {np.percentile(lat, 95):.0f} ms "
            f"| {r['cpu_per_s']:.3f} s |"
        )


if __name__ == "__main__":
    main()
