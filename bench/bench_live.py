#!/usr/bin/env python
"""N concurrent live sessions through the gateway: real speech in real time, frames back, per N the figures.

Starts the services with services.local.LocalCluster (as bench_e2e.py does): the audio stage, lipsync
(--device; a seeded synthetic Wav2Lip, --checkpoint or --procedural; with --gpus 0,1,.. one replica per
listed GPU), superres only with --sr (as many), --gateways gateways and --live-workers live workers
(each --max-sessions, x264 --preset; --pin-cores spreads them over disjoint core sets, the other
processes on the cores left: services/local/affinity.py), no render workers. Then
CreateAvatar with a template video built from samples/avatar.jpg (bench_e2e.build_template, --size) or
the photo itself (--photo), and per session count (--sessions N, or --session-counts 25,50,100 for one
run per count):

* the N sessions are spread over --procs client processes (asyncio and grpc.aio in each, so the client
  is not the bottleneck: the lag of its sends behind their schedule and its CPU are reported);
* each session opens its Converse stream, and once every session is Ready they start together (each at
  a random offset within the first second): utterances of samples/speech.wav (resampled to --rate, a
  random 2-4 s part each) sent in real time in 20 ms chunks, then EndOfUtterance and 1-2 s of silence
  (nothing sent, as a voice agent between sentences), for --seconds; in the second utterance (the
  first when only one fits) a Clear at about its middle, the rest of that utterance not sent (barge-in).

Measured on the client's clock per N:

* latency: speech frame j of an utterance (j = its index less the utterance's PLAYBACK_STARTED frame:
  skipped slots advance the utterance too) shows the audio up to sample (j + 1) * rate / fps; from the
  moment the chunk holding that sample was handed to gRPC to the moment the frame arrived. p50/p95/p99
  over every speech frame of every session. The model's look-ahead (200 ms of audio after the frame)
  is inside it, as it is in the issue's budget;
* skipped: the workers' SessionStats.frames_skipped over the run (late at the worker, not sent) and
  missing: frame indices never received between the first and last frame (skipped or dropped);
  dropped: SessionStats.frames_dropped (the client read too slowly);
* Clear -> idle: from the Clear's send to the first frame that is not the interrupted utterance's
  speech (the stale frames have stopped), p95; and to PLAYBACK_FINISHED(interrupted);
* CPU per session: the live workers' CPU seconds (/proc of their pids and children) over the --seconds
  window, per session-second; the gateways' and lipsync's too; GPU utilisation (nvidia-smi, sampled).

A count "holds" when p95 <= --p95-limit-ms (350) with no skipped and no missing frames and every
session created; the largest such N is printed under the markdown table. --out writes JSON.

--model musetalk: the avatar is made for the 256 px tier and its sessions go to the lipsync-musetalk
stage (--lipsync-replicas of it), from seeded checkpoints in the public formats
(services/lipsync/musetalk/seeded.py; `--tiny`: narrow networks a CPU runs) unless --procedural (the
weight-free musetalk-standin); the stage holds each worker's sessions' audio windows
(`--max-window-positions`, set here from the sessions per worker).

Examples:
    # CPU smoke (~60 s on 2 cores)
    python bench/bench_live.py --device cpu --procedural --sessions 2 --seconds 8
    # the 256 px tier: 18 sessions of 512x512 on seeded MuseTalk networks
    python bench/bench_live.py --model musetalk --device cuda --size 512x512 --sessions 18 --live-workers 2 \
        --procs 2 --out var/bench/live-musetalk.json
    # the H200 table's row: 512x512, H.264 ultrafast, 25..300 sessions (bench/gpu_session.sh live)
    python bench/bench_live.py --device cuda --size 512x512 --codec h264 --preset ultrafast \\
        --session-counts 25,50,100,150,200,300 --live-workers 8 --gateways 2 --procs 4 --out var/bench/live.json
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import datetime as _dt
import json
import math
import multiprocessing
import random
import resource
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np

from bench.bench_e2e import GpuSampler, build_template, check_detector, cpu_by_service, environment, process_cpu_seconds
from services.local.affinity import (
    add_placement_args,
    parse_gpus,
    plan_from_args,
    replicas_for,
    validate_placement_args,
)
from services.local.metrics import StageBatches, scrape

SAMPLES = REPO_ROOT / "samples"
CHUNK_MS = 20
UTTERANCE_S = (2.0, 4.0)  # each utterance: a random part of the speech clip this long
PAUSE_S = (1.0, 2.0)  # silence between utterances (nothing sent)
START_SPREAD_S = 1.0  # sessions start at a random offset within this
TAIL_S = 3.0  # after the script, how long to wait for the last utterance's frames


# --------------------------------------------------------------------------------------------------
# one session's script and measurements (in a client process)
# --------------------------------------------------------------------------------------------------


@dataclass
class Step:
    """One request of a session's script, `at` seconds after the session's start."""

    at: float
    kind: str  # "audio", "end", "clear"
    utterance: int  # the client's utterance number (0-based); the wire numbers them from 1
    pcm: bytes = b""


def session_script(speech: np.ndarray, rate: int, seconds: float, rng: random.Random) -> list[Step]:
    """Utterances (random 2-4 s parts of `speech`, int16 at `rate`) in 20 ms chunks at real time, each
    followed by EndOfUtterance and a 1-2 s pause, for `seconds`; one Clear mid-utterance (the second
    utterance, or the first when only one fits), after which that utterance's rest is not sent and the
    pause follows at once."""
    chunk = rate * CHUNK_MS // 1000
    lengths: list[float] = []
    pauses: list[float] = []  # after each utterance
    t = 0.0
    while t < seconds:
        length = min(rng.uniform(*UTTERANCE_S), seconds - t)
        if length < 0.5:
            break
        lengths.append(length)
        pauses.append(rng.uniform(*PAUSE_S))
        t += length + pauses[-1]
    clear_in = 1 if len(lengths) > 1 else 0
    steps: list[Step] = []
    t = 0.0
    for k, length in enumerate(lengths):
        samples = round(length * rate) // chunk * chunk
        start = rng.randrange(len(speech))
        part = np.take(speech, np.arange(start, start + samples), mode="wrap")
        clear_at = rng.uniform(0.4, 0.6) * samples if k == clear_in else math.inf
        for i in range(0, samples, chunk):
            if i >= clear_at:
                steps.append(Step(t + i / rate, "clear", k))
                break
            steps.append(Step(t + i / rate, "audio", k, part[i : i + chunk].astype("<i2").tobytes()))
        else:
            steps.append(Step(t + samples / rate, "end", k))
        t = steps[-1].at + pauses[k]  # the pause follows the EndOfUtterance, or the Clear
    return steps


@dataclass
class SessionRecord:
    """What one session sent and received, on this process's monotonic clock."""

    session_id: str
    fps: float
    rate: int
    started: float = 0.0  # the script's t = 0
    sent: dict[int, list[float]] = field(default_factory=dict)  # per utterance: each chunk's send time
    sent_ends: dict[int, list[int]] = field(default_factory=dict)  # per utterance: samples sent after each chunk
    lags: list[float] = field(default_factory=list)  # each request's send time less its schedule
    clear_sent: float | None = None
    clear_utterance: int | None = None  # wire number
    frames: list[tuple[int, bool, int, float, int]] = field(
        default_factory=list
    )  # (index, speech, utterance, arrived, bytes)
    started_at_frame: dict[int, int] = field(default_factory=dict)  # wire utterance -> PLAYBACK_STARTED frame
    finished: dict[int, tuple[float, bool]] = field(default_factory=dict)  # wire utterance -> (arrived, interrupted)
    stats_first: Any = None  # the last SessionStats before the script started
    stats_last: Any = None
    error: str = ""

    def summary(self) -> dict:
        """The session's figures (raw lists where they are merged over sessions)."""
        measured = [f for f in self.frames if f[3] >= self.started]
        latencies = []
        for index, speech, utterance, arrived, _ in measured:
            if not speech or utterance not in self.started_at_frame or utterance - 1 not in self.sent:
                continue
            j = index - self.started_at_frame[utterance]
            need = math.ceil((j + 1) * self.rate / self.fps)  # samples this frame's audio reaches
            ends = self.sent_ends[utterance - 1]
            chunk = bisect.bisect_left(ends, need)
            if 0 <= j and chunk < len(ends):
                latencies.append(arrived - self.sent[utterance - 1][chunk])
        missing = measured[-1][0] - measured[0][0] + 1 - len(measured) if measured else 0
        clear_idle = clear_event = None
        if self.clear_sent is not None:
            after = [f for f in measured if f[3] >= self.clear_sent and not (f[1] and f[2] == self.clear_utterance)]
            if after:
                clear_idle = after[0][3] - self.clear_sent
            done = self.finished.get(self.clear_utterance or -1)
            if done and done[1]:
                clear_event = done[0] - self.clear_sent

        def stat(name: str) -> int:
            last = getattr(self.stats_last, name, 0) if self.stats_last is not None else 0
            first = getattr(self.stats_first, name, 0) if self.stats_first is not None else 0
            return int(last - first)

        return {
            "session_id": self.session_id,
            "frames": len(measured),
            "speech_frames": sum(1 for f in measured if f[1]),
            "bytes": sum(f[4] for f in measured),
            "latencies": latencies,
            "missing": max(0, missing),
            "skipped": stat("frames_skipped"),
            "dropped": stat("frames_dropped"),
            "clear_idle_s": clear_idle,
            "clear_event_s": clear_event,
            "lags": self.lags,
            "server_latency_p95_s": getattr(self.stats_last, "latency_p95_seconds", None),
            "error": self.error,
        }


async def converse(
    stub: Any,
    session: Any,
    script: list[Step],
    start: asyncio.Future,
    offset: float,
    ready: asyncio.Event,
    seconds: float,
) -> SessionRecord:
    """One session's Converse stream: Ready, wait for the common start, the script, idle to the end of
    `seconds`, then the last utterance's frames (at most TAIL_S)."""
    import grpc

    from lipline.v1 import session_pb2

    record = SessionRecord(session.id, session.video.fps, session.audio.sample_rate)
    call = stub.Converse()
    playing_done = asyncio.Event()
    expected_last = {"utterance": 0}

    async def read() -> None:
        async for response in call:
            kind = response.WhichOneof("response")
            now = time.monotonic()
            if kind == "frame":
                f = response.frame
                record.frames.append((f.index, f.speech, f.utterance, now, len(f.data)))
            elif kind == "event":
                e = response.event
                if e.kind == session_pb2.SessionEvent.PLAYBACK_STARTED:
                    record.started_at_frame.setdefault(e.utterance, e.frame)
                elif e.kind == session_pb2.SessionEvent.PLAYBACK_FINISHED:
                    record.finished[e.utterance] = (now, e.interrupted)
                    if e.utterance >= expected_last["utterance"] > 0:
                        playing_done.set()
            elif kind == "stats":
                record.stats_last = response.stats
                if not record.started:
                    record.stats_first = response.stats
            elif kind == "ready":
                ready.set()

    await call.write(
        session_pb2.ConverseRequest(
            start=session_pb2.ConverseStart(session_id=session.id, resume_token=session.resume_token, last_frame=-1)
        )
    )
    reader = asyncio.ensure_future(read())
    try:
        t0 = await start + offset
        await asyncio.sleep(max(0.0, t0 - time.monotonic()))
        record.started = t0
        for step in script:
            delay = t0 + step.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.monotonic()
            record.lags.append(now - (t0 + step.at))
            if step.kind == "audio":
                record.sent.setdefault(step.utterance, []).append(now)
                ends = record.sent_ends.setdefault(step.utterance, [])
                ends.append((ends[-1] if ends else 0) + len(step.pcm) // 2)
                await call.write(session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=step.pcm)))
            elif step.kind == "end":
                await call.write(session_pb2.ConverseRequest(end_of_utterance=session_pb2.EndOfUtterance()))
            else:
                record.clear_sent, record.clear_utterance = now, step.utterance + 1
                await call.write(session_pb2.ConverseRequest(clear=session_pb2.Clear()))
        await asyncio.sleep(max(0.0, t0 + seconds - time.monotonic()))  # idle frames to the end of the window
        expected_last["utterance"] = script[-1].utterance + 1 if script else 0
        if script and script[-1].kind == "end" and expected_last["utterance"] not in record.finished:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(playing_done.wait(), TAIL_S)
        await asyncio.sleep(0.2)  # the last frames and stats
    except grpc.aio.AioRpcError as exc:  # a stream error is a result (counted), not the end of the run
        record.error = f"{exc.code().name}: {exc.details()}"
    except asyncio.InvalidStateError:  # a write after the stream had ended: the reader has its status
        record.error = "the stream ended before the script did"
    finally:
        call.cancel()
        reader.cancel()
        try:
            await reader
        except asyncio.CancelledError:
            pass
        except grpc.aio.AioRpcError as exc:  # the stream ended on its own before the script did
            if exc.code() != grpc.StatusCode.CANCELLED and (
                not record.error or record.error.startswith("the stream ended")
            ):
                record.error = f"{exc.code().name}: {exc.details()}"
    return record


async def client_main(
    index: int, address: str, count: int, first: int, config: dict, start_event: Any, start_value: Any, results: Any
) -> None:
    """One client process: `count` sessions on one channel; reports Ready, waits for the start, runs them."""
    import grpc

    from lipline.v1 import gateway_pb2_grpc, session_pb2
    from services.gateway.live_client import pcm_of_audio
    from services.serving.channels import channel_options

    rate = config["rate"]
    speech = np.frombuffer(pcm_of_audio((SAMPLES / "speech.wav").read_bytes(), rate), "<i2")
    codec = session_pb2.VIDEO_CODEC_JPEG if config["codec"] == "jpeg" else session_pb2.VIDEO_CODEC_H264
    options = [*channel_options(64 * 1024 * 1024)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = session_pb2.CreateSessionRequest(
            avatar_id=config["avatar_id"],
            audio=session_pb2.AudioFormat(sample_rate=rate),
            video=session_pb2.VideoFormat(codec=codec),
            super_resolution=config["sr"],
        )
        refused: list[str] = []
        gate = asyncio.Semaphore(8)

        async def create() -> Any:
            async with gate:
                try:
                    return await stub.CreateSession(request, timeout=120)
                except grpc.aio.AioRpcError as exc:
                    refused.append(f"{exc.code().name}: {exc.details()}")
                    return None

        created = [s for s in await asyncio.gather(*(create() for _ in range(count))) if s is not None]
        loop = asyncio.get_running_loop()
        start: asyncio.Future = loop.create_future()
        readies = [asyncio.Event() for _ in created]
        tasks = []
        for i, (session, ready) in enumerate(zip(created, readies)):
            rng = random.Random(config["seed"] * 100_003 + first + i)
            script = session_script(speech, rate, config["seconds"], rng)
            tasks.append(
                asyncio.ensure_future(
                    converse(stub, session, script, start, rng.uniform(0, START_SPREAD_S), ready, config["seconds"])
                )
            )
        try:
            await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 120)
        except TimeoutError:
            refused.append(f"{sum(not r.is_set() for r in readies)} Converse streams not Ready within 120 s")
        results.put(("ready", index, len(created), refused))
        await loop.run_in_executor(None, start_event.wait)
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        start.set_result(start_value.value)
        records = await asyncio.gather(*tasks)
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        for session in created:
            try:
                await stub.CloseSession(session_pb2.CloseSessionRequest(session_id=session.id), timeout=30)
            except grpc.aio.AioRpcError:
                pass
    cpu = cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime
    results.put(("done", index, [r.summary() for r in records], refused, cpu))


def client_process(
    index: int, address: str, count: int, first: int, config: dict, start_event: Any, start_value: Any, results: Any
) -> None:
    try:
        asyncio.run(client_main(index, address, count, first, config, start_event, start_value, results))
    except BaseException as exc:  # the parent waits for every process's answer
        results.put(("failed", index, repr(exc)))
        raise


# --------------------------------------------------------------------------------------------------
# one count of sessions (in the parent)
# --------------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def run_count(n: int, codec: str, cluster: Any, avatar_id: str, args: argparse.Namespace, seconds: float = 0.0) -> dict:
    """N sessions of `codec` over the client processes for `seconds` (default --seconds); the merged figures."""
    seconds = seconds or args.seconds
    procs = max(1, min(args.procs, n))
    shares = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    addresses = cluster.gateway_addresses
    context = multiprocessing.get_context("spawn")
    start_event, start_value, results = context.Event(), context.Value("d", 0.0), context.Queue()
    config = {
        "avatar_id": avatar_id,
        "rate": args.rate,
        "codec": codec,
        "sr": args.sr,
        "seconds": seconds,
        "seed": args.seed,
    }
    children = [
        context.Process(
            target=client_process,
            args=(i, addresses[i % len(addresses)], share, sum(shares[:i]), config, start_event, start_value, results),
            name=f"client-{i}",
        )
        for i, share in enumerate(shares)
    ]
    for child in children:
        child.start()
    try:
        refused: list[str] = []
        created = 0
        for _ in children:
            message = results.get(timeout=300)
            if message[0] == "failed":
                raise SystemExit(f"client process {message[1]} failed: {message[2]}")
            created += message[2]
            refused += message[3]
        log(
            f"{n} sessions: {created} created and Ready"
            + (f"; {len(refused)} problems: {refused[:3]}" if refused else "")
        )
        cpu_before = process_cpu_seconds(cluster)
        batches_before = stage_batches(cluster)
        with GpuSampler(parse_gpus(args.gpus)) as gpu:
            start_value.value = time.monotonic() + 0.5
            start_event.set()
            time.sleep(0.5 + seconds)
            cpu_after = process_cpu_seconds(cluster)
            batches = {name: now.since(batches_before[name], seconds) for name, now in stage_batches(cluster).items()}
            cpu = cpu_by_service(cpu_before, cpu_after)
            # per process too: how evenly the gateway placed the sessions shows in the live workers' share
            by_process = {
                name: round(seconds - cpu_before.get(name, 0.0), 2) for name, seconds in sorted(cpu_after.items())
            }
        sessions: list[dict] = []
        client_cpu = 0.0
        for _ in children:
            message = results.get(timeout=seconds + 120)
            if message[0] == "failed":
                raise SystemExit(f"client process {message[1]} failed: {message[2]}")
            sessions += message[2]
            client_cpu += message[4]
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
    figures = summarize(n, created, refused, sessions, cpu, client_cpu, gpu.summary(), seconds, args.p95_limit_ms)
    for name, stage in batches.items():
        log(
            f"{n} sessions, {name}: {stage['items_per_s']:g} faces/s in {stage['batches_per_s']:g} batches/s (mean "
            f"{stage['mean_batch']:g}), {stage['compute_ms_per_batch']:g} ms of model time a batch, busy "
            f"{100 * stage['compute_share']:.0f} %, {stage['queue_ms_per_item']:g} ms queued a face"
        )
    return {"codec": codec, **figures, "cpu_seconds_by_process": by_process, "stage_batches": batches}


def stage_batches(cluster: Any) -> dict[str, StageBatches]:
    """The face stages' batch counters now (lipsync, lipsync-musetalk and their replicas): how the live
    faces were batched, and how much of the time the model ran, beside nvidia-smi's busy figure."""
    return {
        name: StageBatches.read(scrape(proc.metrics_port))
        for name, proc in cluster.processes.items()
        if name.startswith("lipsync") and proc.process.poll() is None
    }


def summarize(
    n: int,
    created: int,
    refused: list[str],
    sessions: list[dict],
    cpu: dict,
    client_cpu: float,
    gpu: dict,
    seconds: float,
    p95_limit_ms: float,
) -> dict:
    """The figures of one count, merged over its sessions; `holds`: p95 within the limit, nothing skipped or missing, all created."""
    latencies = [x for s in sessions for x in s["latencies"]]
    clear_idle = [s["clear_idle_s"] for s in sessions if s["clear_idle_s"] is not None]
    clear_event = [s["clear_event_s"] for s in sessions if s["clear_event_s"] is not None]
    lags = [x for s in sessions for x in s["lags"]]
    session_seconds = max(1e-9, created * seconds)
    frames = sum(s["frames"] for s in sessions)
    result = {
        "sessions": n,
        "created": created,
        "refused": refused,
        "errors": [s["error"] for s in sessions if s["error"]],
        "frames": frames,
        "speech_frames": sum(s["speech_frames"] for s in sessions),
        "mean_frame_bytes": sum(s["bytes"] for s in sessions) / max(1, frames),
        "latency_ms": {f"p{q}": None if (v := pct(latencies, q)) is None else 1000 * v for q in (50, 95, 99)},
        "latency_samples": len(latencies),
        "skipped": sum(s["skipped"] for s in sessions),
        "missing": sum(s["missing"] for s in sessions),
        "dropped": sum(s["dropped"] for s in sessions),
        "clears": len(clear_idle),
        "clears_with_interrupted_event": len(clear_event),
        "clear_idle_ms": {f"p{q}": None if (v := pct(clear_idle, q)) is None else 1000 * v for q in (50, 95)},
        "clear_event_ms_p95": None if (v := pct(clear_event, 95)) is None else 1000 * v,
        "cpu_seconds_by_service": cpu,
        "live_cpu_ms_per_session_s": 1000 * cpu.get("live", 0.0) / session_seconds,
        "gateway_cpu_ms_per_session_s": 1000 * cpu.get("gateway", 0.0) / session_seconds,
        "lipsync_cpu_ms_per_session_s": 1000 * cpu.get("lipsync", 0.0) / session_seconds,
        # the workers' own view (audio arrived at the worker -> frame sent), each session's last stats period
        "server_latency_p95_ms_mean": None
        if not (server := [s["server_latency_p95_s"] for s in sessions if s["server_latency_p95_s"]])
        else 1000 * float(np.mean(server)),
        "client_cpu_ms_per_session_s": 1000 * client_cpu / session_seconds,
        "client_send_lag_ms_p99": None if (v := pct(lags, 99)) is None else 1000 * v,
        "gpu_utilization": gpu,
        "per_session": [{k: v for k, v in s.items() if k not in ("latencies", "lags")} for s in sessions],
    }
    p95 = result["latency_ms"]["p95"]
    result["holds"] = bool(
        created == n
        and not result["errors"]
        and p95 is not None
        and p95 <= p95_limit_ms
        and result["skipped"] == 0
        and result["missing"] == 0
    )
    return result


# --------------------------------------------------------------------------------------------------
# services, avatar, report
# --------------------------------------------------------------------------------------------------


def stage_args(args: argparse.Namespace, workdir: Path, max_sessions: int) -> dict[str, list[str]]:
    level = f"--log-level={args.log_level}"
    lipsync = [f"--device={args.device}", level]
    if args.checkpoint:
        lipsync.append(f"--checkpoint={args.checkpoint}")
    elif not args.procedural:
        from bench.bench_lipsync_grpc import write_seeded_checkpoint

        path = workdir / "wav2lip-seeded.pth"
        write_seeded_checkpoint(path)
        lipsync.append(f"--checkpoint={path}")
    superres = [f"--device={args.device}", level, "--model=realesr-general-x4v3"]
    if args.sr and args.device != "cpu":
        from bench.bench_superres_grpc import write_seeded_checkpoint as write_seeded_sr

        path = workdir / "realesr-general-x4v3-seeded.pth"
        write_seeded_sr(path, "realesr-general-x4v3")
        superres.append(f"--checkpoint={path}")
    # Hundreds of long streams: no stream caps, no connection ageing in the middle of a count.
    streams = ["--max-concurrent-streams=0", "--max-connection-age-s=86400"]
    stages = {}
    if args.model == "musetalk":
        # a session's live window holds up to 1500 encoder positions at the stage (its job window's)
        musetalk = [
            f"--device={args.device}",
            level,
            *streams,
            f"--max-window-positions={max(32000, 1500 * max_sessions)}",
        ]
        if not args.procedural:
            from services.lipsync.musetalk.seeded import given_or_seeded_networks

            paths = given_or_seeded_networks(args.musetalk_dir, workdir / "musetalk-models", small=args.tiny)
            musetalk += [f"--{name.replace('_', '-')}={path}" for name, path in paths.items()]
        stages["lipsync-musetalk"] = musetalk + shlex.split(args.musetalk_flags)
    return {
        **stages,
        "audio": [level],
        "lipsync": lipsync + shlex.split(args.lipsync_flags),
        "superres": superres,
        "gateway": [level, *streams, "--max-streams-per-client=0", *shlex.split(args.gateway_flags)],
        "live": [
            level,
            *streams,
            f"--max-sessions={max_sessions}",
            f"--x264-preset={args.preset}",
            *shlex.split(args.live_flags),
        ],
    }


def codec_name(codec: str, preset: str) -> str:
    return f"h264 {preset}" if codec == "h264" else codec


def placement_note(placement: dict) -> str:
    """The heading's placement part, e.g. ", lipsync x2 on GPUs 0,1, live workers pinned" (empty by default)."""
    replicas = placement.get("replicas", {}).get("lipsync", 1)
    note = f", lipsync x{replicas}" if replicas > 1 else ""
    if placement.get("gpus"):
        note += f"{'' if note else ', lipsync'} on GPUs {','.join(placement['gpus'])}"
    if placement.get("cores"):
        note += ", live workers pinned to their own cores"
    return note


def table(result: dict) -> str:
    a = result["args"]
    lines = [
        f"{a['size']} at {result['avatar']['fps']:g} fps, x264 {a['preset']} (H.264 sessions), "
        f"{a['live_workers']} live workers, {a['gateways']} gateways, {a['procs']} client processes, {a['seconds']:g} s per count, "
        f"device {a['device']}{' (procedural)' if a['procedural'] else ''}{' + SR' if a['sr'] else ''}"
        f"{placement_note(result.get('placement', {}))}",
        f"device {a['device']}{' (procedural)' if a['procedural'] else ''}{' + SR' if a['sr'] else ''}, "
        f"model {a.get('model', 'wav2lip')}{' (tiny)' if a.get('tiny') else ''}",
        "",
        "| codec | sessions | latency p50 / p95 / p99 ms | skipped | missing | dropped | Clear -> idle p95 ms | live CPU ms / session-s | "
        "gateway CPU ms / session-s | GPU util median % | KB / frame | client lag p99 ms | holds |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    for r in result["counts"]:
        lat = r["latency_ms"]
        created = "" if r["created"] == r["sessions"] else f" ({r['created']} created)"
        lines.append(
            f"| {codec_name(r['codec'], a['preset'])} | {r['sessions']}{created} | {ms(lat['p50'])} / {ms(lat['p95'])} / {ms(lat['p99'])} | "
            f"{r['skipped']} | {r['missing']} | "
            f"{r['dropped']} | {ms(r['clear_idle_ms']['p95'])} | {r['live_cpu_ms_per_session_s']:.1f} | {r['gateway_cpu_ms_per_session_s']:.1f} | "
            f"{r['gpu_utilization'].get('median', '-')} | {r['mean_frame_bytes'] / 1000:.1f} | {ms(r['client_send_lag_ms_p99'])} | "
            f"{'yes' if r['holds'] else 'no'} |"
        )
    lines.append("")
    for codec, best in result["largest_holding"].items():
        lines.append(
            f"{codec}: largest N with p95 <= {a['p95_limit_ms']:g} ms and no skipped frames: {best if best else 'none'}"
        )
    errors = [e for r in result["counts"] for e in r["errors"] + r["refused"]]
    if errors:
        lines.append(f"errors ({len(errors)}): " + "; ".join(sorted(set(errors))[:5]))
    return "\n".join(lines)


def write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, workdir: Path) -> dict:
    from services.gateway.client import LiplineClient
    from services.local.cluster import LocalCluster

    counts = [int(c) for c in args.session_counts.split(",")] if args.session_counts else [args.sessions]
    codecs = args.codec.split(",")
    max_sessions = args.max_sessions or math.ceil(max(counts) / args.live_workers)
    width, height = (int(x) for x in args.size.split("x"))
    result: dict = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "environment": environment(args.device),
        "max_sessions_per_worker": max_sessions,
    }
    if args.photo:
        avatar_bytes = (SAMPLES / "avatar.jpg").read_bytes()
    else:
        template = workdir / "template.mp4"
        build_template(template, width, height, 25.0, args.template_seconds)
        avatar_bytes = template.read_bytes()
    # The client processes and every unpinned service inherit this process's cores (the rest, with --pin-cores).
    gpus, cores = plan_from_args(args.gpus, args.pin_cores, {"live": args.live_workers})
    model_replicas = replicas_for(args.lipsync_replicas, gpus)
    replicas = {
        "render": 0,
        "live": args.live_workers,
        "lipsync": model_replicas,
        "superres": model_replicas if args.sr else 0,
        "gateway": args.gateways,
        "lipsync-musetalk": model_replicas if args.model == "musetalk" else 0,
    }
    result["placement"] = {"replicas": replicas, "gpus": gpus, "cores": cores}
    t = time.perf_counter()
    extra = stage_args(args, workdir, max_sessions)
    with LocalCluster(
        workdir / "cluster",
        extra_args=extra,
        start_timeout_s=args.startup_timeout,
        replicas=replicas,
        gpus=gpus,
        cores=cores,
    ) as cluster:
        result["startup_seconds"] = time.perf_counter() - t
        log(f"services SERVING after {result['startup_seconds']:.1f} s (logs in {workdir / 'cluster'})")
        with LiplineClient(cluster.gateway_address, timeout=600) as client:
            avatar = client.create_avatar(avatar_bytes, name="bench-live", model=args.model)
        result["avatar"] = {
            "id": avatar.id,
            "frames": avatar.frame_count,
            "faces_found": avatar.faces_found,
            "width": avatar.width,
            "height": avatar.height,
            "fps": avatar.fps,
        }
        log(f"CreateAvatar: {avatar.width}x{avatar.height}, {avatar.frame_count} frames, face in {avatar.faces_found}")
        if args.warmup_seconds > 0:  # every worker loads the avatar, the stage sees full batches; not reported
            warm = run_count(max(counts), codecs[0], cluster, avatar.id, args, seconds=args.warmup_seconds)
            log(
                f"warm-up: {warm['sessions']} sessions for {args.warmup_seconds:g} s, p95 {warm['latency_ms']['p95'] or float('nan'):.0f} ms"
            )
            time.sleep(1.0)
        result["counts"] = []
        failing: dict[str, int] = {}  # per codec: counts in a row that did not hold
        for codec, n in ((c, n) for c in codecs for n in counts):
            if failing.get(codec, 0) >= 2 and not args.all_counts:
                log(f"{codec} {n} sessions: not run (the two counts before did not hold; --all-counts runs them)")
                continue
            r = run_count(n, codec, cluster, avatar.id, args)
            result["counts"].append(r)
            failing[codec] = 0 if r["holds"] else failing.get(codec, 0) + 1
            lat = r["latency_ms"]
            log(
                f"{codec} {n} sessions: p50/p95 {lat['p50'] or float('nan'):.0f}/{lat['p95'] or float('nan'):.0f} ms, skipped {r['skipped']}, "
                f"missing {r['missing']}, live CPU {r['live_cpu_ms_per_session_s']:.1f} ms/session-s, holds {r['holds']}"
            )
            if args.out:  # so far, in case the run is cut short (a device call's time limit)
                write_json(args.out, result)
            time.sleep(1.0)  # the sessions closed; their leases released
    result["largest_holding"] = {
        c: max((r["sessions"] for r in result["counts"] if r["codec"] == c and r["holds"]), default=None)
        for c in codecs
    }
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="lipsync (and superres) --device")
    p.add_argument("--sessions", type=int, default=2, help="concurrent sessions (one count)")
    p.add_argument("--session-counts", default="", help="e.g. 25,50,100,150: one run per count (overrides --sessions)")
    p.add_argument("--seconds", type=float, default=20.0, help="how long each session runs its script")
    p.add_argument(
        "--size", default="512x512", help="template size WxH (512x512 or 1280x720); the sessions' frame size"
    )
    p.add_argument("--photo", action="store_true", help="the avatar is samples/avatar.jpg itself, not a template video")
    p.add_argument("--template-seconds", type=float, default=4.0, help="length of the template video")
    p.add_argument(
        "--codec",
        default="h264",
        help="h264, jpeg, or both (h264,jpeg: every count once per codec, on the same services)",
    )
    p.add_argument(
        "--preset",
        default="ultrafast",
        choices=["ultrafast", "superfast", "veryfast", "faster", "fast", "medium"],
        help="live workers' --x264-preset",
    )
    p.add_argument("--rate", type=int, default=16000, choices=[16000, 24000, 48000], help="the sessions' PCM rate")
    p.add_argument("--sr", action="store_true", help="super-resolution on (starts the superres stage)")
    p.add_argument("--live-workers", type=int, default=1, help="live worker processes")
    p.add_argument(
        "--lipsync-replicas",
        type=int,
        default=0,
        help="lipsync (and with --sr superres) processes; default: one per --gpus entry, else 1",
    )
    add_placement_args(p, "live workers")
    p.add_argument(
        "--max-sessions",
        type=int,
        default=0,
        help="each live worker's --max-sessions (0: enough for the largest count)",
    )
    p.add_argument("--gateways", type=int, default=1, help="gateway processes (client processes spread over them)")
    p.add_argument("--procs", type=int, default=1, help="client processes the sessions are spread over")
    p.add_argument("--checkpoint", default="", help="lipsync wav2lip.pth; default: a seeded synthetic one")
    p.add_argument("--procedural", action="store_true", help="lipsync without weights (the procedural stand-in)")
    p.add_argument("--model", default="wav2lip", choices=["wav2lip", "musetalk"], help="the avatar's tier")
    p.add_argument("--tiny", action="store_true", help="musetalk: narrow seeded networks (a CPU's smoke run)")
    p.add_argument("--musetalk-dir", default="", help="musetalk: a models folder in the public layout")
    p.add_argument("--musetalk-flags", default="", help="more lipsync-musetalk flags, e.g. '--max-batch=64'")
    p.add_argument("--lipsync-flags", default="", help="more lipsync flags, e.g. '--max-batch=256'")
    p.add_argument("--gateway-flags", default="", help="more gateway flags")
    p.add_argument("--live-flags", default="", help="more live worker flags")
    p.add_argument(
        "--p95-limit-ms", type=float, default=350.0, help="a count holds with p95 at most this and no skipped frames"
    )
    p.add_argument(
        "--all-counts",
        action="store_true",
        help="run every count even after two in a row did not hold (default: skip the rest)",
    )
    p.add_argument(
        "--warmup-seconds", type=float, default=0.0, help="first an unreported run of the largest count for this long"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--log-level", default="WARNING", help="services' log level")
    p.add_argument(
        "--workdir", type=Path, default=None, help="keep the template and the services' logs here (default: a temp dir)"
    )
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    try:
        width, height = (int(x) for x in args.size.split("x"))
    except ValueError:
        p.error(f"--size must be WxH, got {args.size!r}")
    if width % 2 or height % 2:
        p.error("--size must be even (H.264 yuv420p)")
    if not set(args.codec.split(",")) <= {"h264", "jpeg"}:
        p.error(f"--codec must be h264, jpeg or h264,jpeg, got {args.codec!r}")
    if args.checkpoint and args.procedural:
        p.error("--checkpoint and --procedural exclude each other")
    if min(args.sessions, args.live_workers, args.gateways, args.procs) < 1 or args.seconds <= 0:
        p.error("--sessions, --live-workers, --gateways and --procs must be at least 1, --seconds above 0")
    validate_placement_args(p, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_detector()
    # `timeout` sends SIGTERM: unwind, so that the services are stopped and nothing holds the GPU after us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lipline-live-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        result = run(args, workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(table(result))
    if args.out:
        write_json(args.out, result)
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
