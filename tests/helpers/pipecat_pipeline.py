"""A real Pipecat pipeline around LiplineVideoService, run in .venv-pipecat (pipecat-ai pins protobuf<7, the
services' environment has 7: requirements-pipecat.lock), recording what comes out for the test or bench
that started it (tests/integration/test_pipecat.py, bench/bench_voice_agents.py).

    .venv-pipecat/bin/python tests/helpers/pipecat_pipeline.py SCENARIO --address A --avatar ID --speech PCM --out DIR

The pipeline is `Source -> LiplineVideoService -> Sink` in a PipelineWorker run by a PipelineRunner. The
source plays a TTS: TTSStartedFrame, the speech (PCM s16le mono at --rate, a file) as TTSAudioRawFrames of
20 ms pushed in real time, TTSStoppedFrame; it records the frames that come back upstream (ErrorFrame).
The sink records, with the wall clock: every OutputImageRawFrame (its size and the luma of --mouth's box),
every audio frame (which image it follows), TTSStoppedFrames, TTFB metrics. Scenarios:

- `talk`: 1 s idle, the speech, 1.5 s pause, the speech again, played out; then the speech once more,
  interrupted by an InterruptionFrame after --interrupt-after s; 1 s more; EndFrame.
- `error`: the session is created with --api-key; waits for the ErrorFrame (20 s at most); EndFrame.
- `restart`: the speech, played out; prints "restart?" and waits for a line on stdin (the test
  restarts the gateway); the speech again, played out; EndFrame.
- `bench`: the speech --repeat times with a 0.5 s pause, played out; EndFrame.

Writes DIR/record.json (events, times, the session id) and DIR/frames.npz (mouth crops, audio).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from lipline_pipecat import LiplineVideoService
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    MetricsFrame,
    OutputImageRawFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

CHUNK_S = 0.02


class Source(FrameProcessor):
    """The TTS's place: pushes frames downstream, records what comes back upstream."""

    def __init__(self) -> None:
        super().__init__(name="source")
        self.errors: list[dict[str, Any]] = []
        self.pushed: list[float] = []  # when each TTS audio frame was pushed (wall clock)
        self.started = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, ErrorFrame) and direction == FrameDirection.UPSTREAM:
            self.errors.append({"t": time.monotonic(), "error": frame.error})
            return
        if isinstance(frame, StartFrame):
            self.started.set()
        await self.push_frame(frame, direction)

    async def say(self, pcm: bytes, rate: int, stop_after_s: float | None = None) -> None:
        """One utterance as a TTS streams it, in real time; `stop_after_s`: cut short (no TTSStoppedFrame)."""
        await self.push_frame(TTSStartedFrame())
        step = int(rate * CHUNK_S) * 2
        started = time.monotonic()
        for i, at in enumerate(range(0, len(pcm), step)):
            if stop_after_s is not None and i * CHUNK_S >= stop_after_s:
                return
            self.pushed.append(time.monotonic())
            await self.push_frame(TTSAudioRawFrame(audio=pcm[at : at + step], sample_rate=rate, num_channels=1))
            await asyncio.sleep(max(0.0, started + (i + 1) * CHUNK_S - time.monotonic()))
        await self.push_frame(TTSStoppedFrame())


class Sink(FrameProcessor):
    """The output transport's place: records what the service sends on."""

    def __init__(self, mouth: tuple[int, int, int, int] | None) -> None:
        super().__init__(name="sink")
        self.mouth = mouth
        self.images: list[float] = []
        self.indices: list[int] = []  # the session's frame index of each image
        self.speech: list[bool] = []
        self.sizes: set[tuple[int, int]] = set()
        self.crops: list[np.ndarray] = []
        self.audio: list[tuple[int, float, bytes]] = []  # (images before it, time, pcm)
        self.stops: list[float] = []
        self.ttfb: list[float] = []
        self.stopped = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        now = time.monotonic()
        if isinstance(frame, OutputImageRawFrame):
            self.images.append(now)
            self.indices.append(frame.metadata.get("lipline_frame", -1))
            self.speech.append(bool(frame.metadata.get("lipline_speech")))
            self.sizes.add(frame.size)
            if self.mouth is not None:
                x1, y1, x2, y2 = self.mouth
                rgb = np.frombuffer(frame.image, np.uint8).reshape(frame.size[1], frame.size[0], 3)
                box = rgb[y1:y2, x1:x2].astype(np.float32)
                self.crops.append((box @ np.array([0.299, 0.587, 0.114], np.float32)).round().astype(np.uint8))
        elif isinstance(frame, TTSAudioRawFrame):
            self.audio.append((len(self.images), now, frame.audio))
        elif isinstance(frame, TTSStoppedFrame):
            self.stops.append(now)
            self.stopped.set()
        elif isinstance(frame, MetricsFrame):
            self.ttfb += [d.value for d in frame.data if isinstance(d, TTFBMetricsData) and d.value > 0]
        await self.push_frame(frame, direction)

    async def wait_stops(self, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.stops) < count and time.monotonic() < deadline:
            self.stopped.clear()
            try:
                await asyncio.wait_for(self.stopped.wait(), max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                break


async def scenario(args: argparse.Namespace, source: Source, sink: Sink, service: LiplineVideoService) -> dict:
    pcm = Path(args.speech).read_bytes()
    record: dict[str, Any] = {}
    await asyncio.wait_for(source.started.wait(), 60)
    await asyncio.sleep(1.0)
    record["session_id"] = service.session.id if service.session else None
    if args.scenario == "talk":
        await source.say(pcm, args.rate)
        await asyncio.sleep(1.5)
        await source.say(pcm, args.rate)
        await sink.wait_stops(2)
        await asyncio.sleep(0.5)
        record["interrupt_from_image"] = len(sink.images)
        await source.say(pcm, args.rate, stop_after_s=args.interrupt_after)
        record["interrupted_at"] = time.monotonic()
        record["interrupt_image"] = len(sink.images)
        await source.push_frame(InterruptionFrame())
        await asyncio.sleep(1.0)
    elif args.scenario == "error":
        deadline = time.monotonic() + 20
        while not source.errors and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    elif args.scenario == "restart":
        await source.say(pcm, args.rate)
        await sink.wait_stops(1)
        record["before_restart_images"] = len(sink.images)
        print("restart?", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        record["restarted_at"] = time.monotonic()
        record["after_restart_image"] = len(sink.images)
        await source.say(pcm, args.rate)
        await sink.wait_stops(2)
        await asyncio.sleep(0.3)
    elif args.scenario == "bench":
        for k in range(args.repeat):
            await source.say(pcm, args.rate)
            await asyncio.sleep(0.5)
        await sink.wait_stops(args.repeat)
        await asyncio.sleep(0.3)
    record["ended_at"] = time.monotonic()
    return record


async def main(args: argparse.Namespace) -> None:
    mouth = tuple(int(v) for v in args.mouth.split(",")) if args.mouth else None
    source, sink = Source(), Sink(mouth)  # type: ignore[arg-type]
    service = LiplineVideoService(
        avatar_id=args.avatar,
        address=args.address,
        api_key=args.api_key,
        codec=args.codec,
        max_height=args.max_height,
    )
    worker = PipelineWorker(
        Pipeline([source, service, sink]),
        params=PipelineParams(audio_out_sample_rate=args.rate, enable_metrics=True),
        enable_rtvi=False,
        idle_timeout_secs=None,
    )
    runner = PipelineRunner(handle_sigint=False)
    run = asyncio.create_task(runner.run(worker))
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    wall0 = time.monotonic()
    record = await scenario(args, source, sink, service)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    await worker.queue_frame(EndFrame())
    await asyncio.wait_for(run, 60)
    record.update(
        started=wall0,
        cpu_s=(cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
        wall_s=record["ended_at"] - wall0,
        images=sink.images,
        indices=sink.indices,
        speech=sink.speech,
        sizes=sorted(sink.sizes),
        audio_times=[t for _, t, _ in sink.audio],
        audio_after=[n for n, _, _ in sink.audio],
        stops=sink.stops,
        ttfb=sink.ttfb,
        errors=source.errors,
        pushed=source.pushed,
        rate=args.rate,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "record.json").write_text(json.dumps(record))
    np.savez(
        out / "frames.npz",
        crops=np.stack(sink.crops) if sink.crops else np.zeros((0, 1, 1), np.uint8),
        audio=np.frombuffer(b"".join(a for _, _, a in sink.audio), np.uint8),
        audio_lengths=np.array([len(a) for _, _, a in sink.audio], np.int64),
    )
    print("done", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=["talk", "error", "restart", "bench"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--avatar", required=True)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--speech", required=True, help="PCM s16le mono at --rate")
    parser.add_argument("--rate", type=int, default=24000)
    parser.add_argument("--codec", default="jpeg")
    parser.add_argument("--max-height", type=int, default=0)
    parser.add_argument("--mouth", default="", help="x1,y1,x2,y2 of the box whose luma is recorded")
    parser.add_argument("--interrupt-after", type=float, default=0.8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", required=True)
    asyncio.run(main(parser.parse_args()))
