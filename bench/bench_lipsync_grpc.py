#!/usr/bin/env python
"""Sustained throughput of the lipsync service's Generate RPC under concurrent streams.

Starts `python -m services.lipsync` as a subprocess (port 0 + --port-file, metrics off), then opens
--streams concurrent Generate streams (grpc.aio). Each stream sends its reference crops once (with
its first items) and then messages of --items items (one mel window per item, cycling over the
crops) for --seconds, keeping at most --window messages in flight. Reports:

* sustained frames/s (responses received after --warmup-seconds, over the remaining send window);
* p50 / p99 per-message latency (request yielded to gRPC -> its response received);
* the service's batch size, *estimated* from responses: the batcher resolves one batch's items
  together, so responses arrive in bursts; bursts are split at gaps > --burst-gap-ms and the mean
  frames per burst is reported (messages straddle batches, so this is approximate).

Only grpcio, protobuf, numpy, torch and opencv are needed on the client side; the service itself
also needs grpcio-health-checking, grpcio-reflection, prometheus-client and opentelemetry-api (not
PyAV/librosa: the lipsync import chain does not touch them; this script checks before starting).

The service process and the multi-process load driver are stage-agnostic (`start_service`,
`serve_and_load`, `load` take the stage, its flags, the stub class and a per-stream coroutine):
bench_superres_grpc.py reuses them for the superres service's Upscale RPC.

Weights: a seeded synthetic Wav2Lip checkpoint is written to a temp dir unless --checkpoint is
given (speed does not depend on the values); --procedural runs the weight-free stand-in instead.

`--model musetalk` measures the lipsync-musetalk stage (`python -m services.lipsync.musetalk`, the
256 px tier) the same way: seeded full-size networks in the public layout are written to the temp
dir (services/lipsync/musetalk/seeded.py: unet.pth + musetalk.json, the sd-vae folder, the whisper
folder; `--small` for CPU-sized ones, `--musetalk-dir` for real ones, `--standin` for the weight-free
stand-in); each stream sends its LatentBank (`--crops` latents) and one 30 s audio window with its
first message, then items (frame i: latent i mod crops, window offset 2 i - 4 within the window).
`--fast-decode` passes the stage's switch. The frames are 256 x 256.

Examples:
    python bench/bench_lipsync_grpc.py --device cpu --streams 2 --items 4 --seconds 5 --max-batch 8
    python bench/bench_lipsync_grpc.py --device cuda --max-batch 256 --out var/bench/grpc-h200.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import importlib.util
import json
import signal
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO_ROOT))

import grpc
import numpy as np

from lipline.v1 import common_pb2, lipsync_pb2, lipsync_pb2_grpc
from services.local.affinity import gpu_of, parse_gpus, replicas_for
from services.local.process import ServiceProcess, start
from services.media.wire import image_to_proto, mel_to_bytes, pack_generate_items
from services.serving.streams import stream_call

# What `python -m services.lipsync` (and services.superres) imports beyond this script's own needs
# (module -> pip name).
SERVICE_MODULES = {
    "grpc_health": "grpcio-health-checking",
    "grpc_reflection": "grpcio-reflection",
    "prometheus_client": "prometheus-client",
    "opentelemetry": "opentelemetry-api",
    "cv2": "opencv-python-headless",
    "torch": "torch",
}


def check_service_imports() -> list[str]:
    return [f"{mod} (pip: {pip})" for mod, pip in SERVICE_MODULES.items() if importlib.util.find_spec(mod) is None]


def write_seeded_checkpoint(path: Path) -> None:
    import torch

    from services.inference.checkpoints import seeded_state_dict
    from services.lipsync.wav2lip import Wav2Lip

    model = Wav2Lip()
    torch.save({"state_dict": seeded_state_dict(model)}, path)


def musetalk_flags(args: argparse.Namespace, workdir: Path) -> list[str]:
    """The lipsync-musetalk stage's flags: its checkpoints (seeded ones written under `workdir`
    unless --musetalk-dir or --standin), precision, the switch and the model-serving flags."""
    flags: list[str] = []
    if not args.standin:
        from services.lipsync.musetalk.seeded import given_or_seeded_networks

        t0 = time.perf_counter()
        paths = given_or_seeded_networks(args.musetalk_dir, workdir / "musetalk", small=args.small)
        if not args.musetalk_dir:
            print(f"seeded musetalk networks written in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        for name, path in paths.items():
            flags += ["--" + name.replace("_", "-"), str(path)]
    if args.precision:
        flags += ["--precision", args.precision]
    if args.fast_decode:
        flags += ["--fast-decode", "true"]
    if args.compile_mode:
        flags += ["--compile-mode", args.compile_mode]
    if args.max_rel_error is not None:
        flags += ["--max-rel-error", str(args.max_rel_error)]
    return flags + serving_flags(args)


# --------------------------------------------------------------------------------------------------
# the service process
# --------------------------------------------------------------------------------------------------


def lipsync_flags(args: argparse.Namespace) -> list[str]:
    """The lipsync-only service flags (start_service adds the common ones)."""
    flags = ["--detector", "none"]  # only Generate is measured; OpenCV 5 on GPU images lacks Haar cascades
    if args.checkpoint:
        flags += ["--checkpoint", args.checkpoint]
    if args.precision:
        flags += ["--precision", args.precision]
    return flags + serving_flags(args)


def serving_flags(args: argparse.Namespace) -> list[str]:
    """The model-serving flags both model stages share (`add_load_args`), where given."""
    flags = []
    for flag in ("backend", "batch_buckets", "pipeline_depth", "compile_cache_dir"):
        value = getattr(args, flag)
        if value:
            flags += ["--" + flag.replace("_", "-"), str(value)]
    return flags


def start_service(
    args: argparse.Namespace, workdir: Path, replica: int = 0, stage: str = "lipsync", flags: Sequence[str] = ()
) -> ServiceProcess:
    """`python -m services.<stage>` on port 0 with metrics off (services.local.process, as the local cluster
    starts it); `flags` are the stage's own settings.

    Uses args.device, max_batch, max_delay_ms, log_level, streams, items, window and gpus.
    """
    common = [
        "--port",
        "0",
        "--metrics-port",
        "-1",
        "--device",
        args.device,
        "--max-batch",
        str(args.max_batch),
        "--max-delay-ms",
        str(args.max_delay_ms),
        "--log-format",
        "text",
        "--log-level",
        args.log_level,
        "--grace-s",
        "2",
        "--max-concurrent-streams",
        str(max(256, args.streams * 2)),
        "--max-pending-per-stream",
        str(max(512, args.items * (args.window + 1))),
    ]
    return start(
        f"{stage}-{replica}",
        stage,
        flags,
        workdir,
        base_args=common,
        cuda_visible_devices=gpu_of(parse_gpus(args.gpus), replica),  # replica i sees only gpus[i % n]
    )


# --------------------------------------------------------------------------------------------------
# the load
# --------------------------------------------------------------------------------------------------


class Stats:
    def __init__(self) -> None:
        self.latencies: list[tuple[float, float]] = []  # (received at, seconds)
        self.arrivals: list[tuple[float, int]] = []  # (received at, items: frames, crops)
        self.model_info: common_pb2.ModelInfo | None = None
        self.errors: list[str] = []

    def received(self, sent_at: float, items: int, response: object) -> None:
        """Record one response: its latency (from when its request was yielded), item count and model."""
        now = time.perf_counter()
        self.latencies.append((now, now - sent_at))
        self.arrivals.append((now, items))
        if response.HasField("model") and self.model_info is None:
            self.model_info = response.model


async def paced_stream(
    generate: Callable[..., Any],
    message: Callable[[list[int], bool], Any],
    sid: int,
    args: argparse.Namespace,
    stop_at: float,
    stats: Stats,
) -> None:
    """One Generate stream of either tier: `message(frame indices, first)` for --items frames at a time
    until `stop_at`, at most --window messages unanswered; each answer recorded into `stats`."""
    window = asyncio.Semaphore(args.window)
    sent: deque[float] = deque()

    async def requests() -> AsyncIterator[Any]:
        frame = 0
        while time.perf_counter() < stop_at:
            await window.acquire()
            request = message(list(range(frame, frame + args.items)), frame == 0)
            frame += args.items
            sent.append(time.perf_counter())
            yield request

    try:
        call = stream_call(generate, requests())  # a failure building the requests is raised here
        async for response in call:
            window.release()
            stats.received(sent.popleft(), len(response.faces.frame_indices), response)
    except grpc.aio.AioRpcError as exc:
        stats.errors.append(f"stream {sid}: {exc.code().name}: {exc.details()}")


async def run_stream(
    stub: lipsync_pb2_grpc.LipSyncServiceStub, sid: int, args: argparse.Namespace, stop_at: float, stats: Stats
) -> None:
    rng = np.random.default_rng(sid)
    crops = [
        lipsync_pb2.ReferenceCrop(crop_index=i, image=image_to_proto(rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)))
        for i in range(args.crops)
    ]
    mels = [mel_to_bytes(rng.uniform(-4, 0, (80, 16)).astype(np.float32)) for _ in range(32)]

    def message(indices: list[int], first: bool) -> lipsync_pb2.GenerateRequest:
        items = pack_generate_items(indices, [i % args.crops for i in indices], [mels[i % len(mels)] for i in indices])
        return lipsync_pb2.GenerateRequest(crops=crops if first else [], items=items, raw_size=True)

    await paced_stream(stub.Generate, message, sid, args, stop_at, stats)


async def run_musetalk_stream(
    stub: lipsync_pb2_grpc.MuseTalkServiceStub, sid: int, args: argparse.Namespace, stop_at: float, stats: Stats
) -> None:
    """One MuseTalk Generate stream: latents and a 30 s window once, then --items items per message."""
    from services.media.musetalk_wire import pack_items, pack_latents, pack_window

    rng = np.random.default_rng(sid)
    latents = (rng.standard_normal((args.crops, 8, 32, 32)) * 0.5).astype(np.float16)
    mel = rng.uniform(-0.7, 1.3, (80, 3000)).astype(np.float16)
    frames_per_window = 1400 // 2  # offsets 2 i - 4 stay inside the window's 1500 positions

    def message(indices: list[int], first: bool) -> lipsync_pb2.MuseTalkGenerateRequest:
        items = pack_items(
            indices,
            [i % args.crops for i in indices],
            [0] * len(indices),
            [2 * (i % frames_per_window) - 4 for i in indices],
        )
        request = lipsync_pb2.MuseTalkGenerateRequest(items=items)
        if first:
            request.latents.CopyFrom(pack_latents(list(range(args.crops)), latents))
            request.windows.append(pack_window(0, mel, -0.7))
        return request

    await paced_stream(stub.Generate, message, sid, args, stop_at, stats)


def estimate_batches(arrivals: Sequence[tuple[float, int]], gap_s: float) -> list[int]:
    """Frames per burst of responses (bursts split where consecutive arrivals are > gap_s apart)."""
    bursts: list[int] = []
    last = None
    for t, n in sorted(arrivals):
        if last is None or t - last > gap_s:
            bursts.append(0)
        bursts[-1] += n
        last = t
    return bursts


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


# run_stream(stub, stream id, args, stop_at, stats): one stream of the measured RPC, recording into stats.
# It must be a module-level function (it is pickled by reference into the --procs client processes).
StreamFn = Callable[[Any, int, argparse.Namespace, float, Stats], Awaitable[None]]


async def drive(
    ports: list[int],
    args: argparse.Namespace,
    first_stream: int,
    streams: int,
    t0: float,
    stub_cls: Callable[[grpc.aio.Channel], Any] = lipsync_pb2_grpc.LipSyncServiceStub,
    stream_fn: StreamFn = run_stream,
) -> Stats:
    """Run `streams` streams (`stream_fn` on `stub_cls` stubs) from this process, starting at monotonic time t0.

    Stream s goes to replica s % len(ports), like the gateway's round-robin over replicas.
    """
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    stats = Stats()
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{p}", options=options) for p in ports]
    try:
        stubs = [stub_cls(c) for c in channels]
        await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        stop_at = t0 + args.seconds
        await asyncio.gather(
            *(
                stream_fn(stubs[(first_stream + s) % len(stubs)], first_stream + s, args, stop_at, stats)
                for s in range(streams)
            )
        )
    finally:
        for c in channels:
            await c.close()
    return stats


def _client_process(
    port: list[int],
    args: argparse.Namespace,
    first_stream: int,
    streams: int,
    t0: float,
    stub_cls: Callable[[grpc.aio.Channel], Any],
    stream_fn: StreamFn,
) -> tuple:
    """Entry point of a client process (--procs > 1): its raw arrivals, latencies and errors."""
    stats = asyncio.run(drive(port, args, first_stream, streams, t0, stub_cls, stream_fn))
    info = stats.model_info.SerializeToString() if stats.model_info else b""
    return stats.arrivals, stats.latencies, stats.errors, info


def load(
    port: list[int],
    args: argparse.Namespace,
    stub_cls: Callable[[grpc.aio.Channel], Any] = lipsync_pb2_grpc.LipSyncServiceStub,
    stream_fn: StreamFn = run_stream,
    unit: str = "frames",
) -> dict:
    """One client process (--procs 1) or several: one Python client cannot feed tens of thousands of frames/s.

    Uses args.procs, streams, seconds, warmup_seconds and burst_gap_ms; `unit` names the items in the
    result's keys (`{unit}_per_s`, `{unit}_measured`, `{unit}_total`).
    """
    t0 = time.perf_counter() + (3.0 if args.procs > 1 else 0.0)  # perf_counter is CLOCK_MONOTONIC: shared
    if args.procs == 1:
        stats = asyncio.run(drive(port, args, 0, args.streams, t0, stub_cls, stream_fn))
    else:
        import multiprocessing

        per = [args.streams // args.procs + (1 if i < args.streams % args.procs else 0) for i in range(args.procs)]
        starts = [sum(per[:i]) for i in range(args.procs)]
        with multiprocessing.get_context("spawn").Pool(args.procs) as pool:
            parts = pool.starmap(
                _client_process, [(port, args, starts[i], per[i], t0, stub_cls, stream_fn) for i in range(args.procs)]
            )
        stats = Stats()
        for arrivals, latencies, errors, info in parts:
            stats.arrivals += arrivals
            stats.latencies += latencies
            stats.errors += errors
            if info and stats.model_info is None:
                stats.model_info = common_pb2.ModelInfo.FromString(info)
    stop_at = t0 + args.seconds
    t_end = time.perf_counter()
    measure_from = t0 + args.warmup_seconds
    window_s = max(stop_at - measure_from, 1e-9)
    measured = sum(n for t, n in stats.arrivals if measure_from <= t <= stop_at)
    lat = [s for t, s in stats.latencies if t >= measure_from]
    bursts = estimate_batches([(t, n) for t, n in stats.arrivals if t >= measure_from], args.burst_gap_ms / 1000)
    return {
        f"{unit}_per_s": measured / window_s,
        f"{unit}_measured": measured,
        f"{unit}_total": sum(n for _, n in stats.arrivals),
        "messages": len(stats.latencies),
        "latency_p50_ms": percentile(lat, 50) * 1e3,
        "latency_p99_ms": percentile(lat, 99) * 1e3,
        "latency_max_ms": max(lat) * 1e3 if lat else float("nan"),
        "est_batch_mean": statistics.mean(bursts) if bursts else float("nan"),
        "est_batch_median": statistics.median(bursts) if bursts else float("nan"),
        "bursts": len(bursts),
        "run_s": t_end - t0,
        "model": {
            "name": stats.model_info.name,
            "backend": stats.model_info.backend,
            "precision": stats.model_info.precision,
        }
        if stats.model_info
        else None,
        "errors": stats.errors[:10],
    }


def serve_and_load(
    args: argparse.Namespace,
    workdir: Path,
    stage: str,
    flags: Sequence[str],
    stub_cls: Callable[[grpc.aio.Channel], Any],
    stream_fn: StreamFn,
    unit: str,
) -> tuple[dict, str]:
    """Start args.replicas `services.<stage>` processes, run `load` against them, stop them.

    Returns `load`'s result plus startup_s and service_exit, and the first replica's log tail.
    """
    args.replicas = replicas_for(args.replicas, parse_gpus(args.gpus))  # 0: one per listed GPU
    services = [start_service(args, workdir, r, stage, flags) for r in range(args.replicas)]
    print("starting: " + " ".join(services[0].cmd) + f" (x{args.replicas})", file=sys.stderr)
    try:
        startup_s = max(s.wait_ready(args.startup_timeout) for s in services)
        ports = [s.port for s in services]
        print(
            f"SERVING on {ports} after {startup_s:.1f}s; {args.streams} streams x {args.items} items for {args.seconds:.0f}s",
            file=sys.stderr,
        )
        result = load(ports, args, stub_cls, stream_fn, unit)
    finally:
        rc = max((s.terminate() or 0) for s in services)
        if args.keep_log:
            Path(args.keep_log).write_text("\n".join(s.log_tail(10**7) for s in services))
    tail = services[0].log_tail(3000)
    result.update(startup_s=startup_s, service_exit=rc)
    return result, tail


def report_errors_and_write(result: dict, args: argparse.Namespace, tail: str, unit: str) -> int:
    """Print errors (with the service log tail), write --out; the exit status (1: errors or nothing measured)."""
    if result["errors"]:
        print("errors:\n  " + "\n  ".join(result["errors"]) + "\nservice log tail:\n" + tail, file=sys.stderr)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        print(f"wrote {out}", file=sys.stderr)
    return 1 if result["errors"] or result[f"{unit}_measured"] == 0 else 0


def print_result_table(args: argparse.Namespace, result: dict, unit: str, extra: dict[str, str] | None = None) -> None:
    """The one-row markdown table both gRPC benchmarks print; `extra` adds stage-specific columns."""
    m = result["model"] or {}
    extra = extra or {}
    cells = {
        "device": args.device,
        "replicas": args.replicas,
        "model": m.get("name", "?"),
        "backend": m.get("backend", "?"),
        "precision": m.get("precision", "?"),
        "max batch": args.max_batch,
        "streams x items": f"{args.streams} x {args.items} (window {args.window})",
        **extra,
        f"{unit}/s": f"{result[f'{unit}_per_s']:,.1f}",
        "p50 ms": f"{result['latency_p50_ms']:.1f}",
        "p99 ms": f"{result['latency_p99_ms']:.1f}",
        "est. batch": f"{result['est_batch_mean']:.1f}",
        "start-up s": f"{result['startup_s']:.1f}",
    }
    numeric = {"replicas", "max batch", f"{unit}/s", "p50 ms", "p99 ms", "est. batch", "start-up s"}
    print("| " + " | ".join(cells) + " |")
    print("|" + "|".join("---:" if k in numeric else "---" for k in cells) + "|")
    print("| " + " | ".join(str(v) for v in cells.values()) + " |")


def add_load_args(p: argparse.ArgumentParser, stage: str) -> None:
    """The load and output flags both gRPC benchmarks share (the stage-specific ones stay in each)."""
    p.add_argument("--procs", type=int, default=1, help="client processes the streams are spread over")
    p.add_argument(
        "--replicas",
        type=int,
        default=0,
        help=f"{stage} service processes (streams round-robin over them; default: one per --gpus entry, else 1)",
    )
    p.add_argument("--gpus", default="", help="e.g. 0,1: replica i runs with CUDA_VISIBLE_DEVICES=gpus[i %% n]")
    p.add_argument("--window", type=int, default=2, help="messages in flight per stream")
    p.add_argument("--seconds", type=float, default=20.0, help="how long each stream sends")
    p.add_argument("--warmup-seconds", type=float, default=3.0, help="excluded from the statistics")
    p.add_argument("--burst-gap-ms", type=float, default=2.0, help="response gap that separates batches")
    p.add_argument("--log-level", default="WARNING", help="service log level")
    p.add_argument("--keep-log", default="", help="copy the service log here")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--backend", default="", help="service --backend (auto, cpu, torch, compile, tensorrt)")
    p.add_argument("--batch-buckets", default="", help="service --batch-buckets, e.g. 8,32,128,256")
    p.add_argument("--pipeline-depth", type=int, default=0, help="service --pipeline-depth (model batches in flight)")
    p.add_argument(
        "--compile-cache-dir", default="", help="service --compile-cache-dir (share it between runs and replicas)"
    )


def checkpoint_label(args: argparse.Namespace) -> str:
    """Where the weights came from, for the JSON."""
    if args.model == "musetalk":
        if args.standin:
            return "standin"
        return args.musetalk_dir or ("seeded-small" if args.small else "seeded")
    return "seeded" if "wav2lip-seeded" in (args.checkpoint or "") else (args.checkpoint or "procedural")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--max-batch", type=int, default=128, help="service --max-batch")
    p.add_argument("--max-delay-ms", type=float, default=5.0, help="service --max-delay-ms")
    p.add_argument("--precision", default="", help="service --precision (fp32, fp16, bf16)")
    p.add_argument("--checkpoint", default="", help="a wav2lip.pth; default: a seeded synthetic one")
    p.add_argument("--procedural", action="store_true", help="no checkpoint: the weight-free stand-in model")
    p.add_argument("--streams", type=int, default=16, help="concurrent Generate streams")
    p.add_argument("--items", type=int, default=64, help="items (frames) per request message")
    p.add_argument("--crops", type=int, default=4, help="reference crops per stream")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for SERVING (compile!)")
    p.add_argument("--model", default="wav2lip", choices=["wav2lip", "musetalk"], help="the tier's stage to measure")
    p.add_argument("--standin", action="store_true", help="musetalk: the weight-free stand-in (no checkpoints)")
    p.add_argument("--small", action="store_true", help="musetalk: small seeded networks (CPU smoke)")
    p.add_argument("--musetalk-dir", default="", help="musetalk: a models folder in the public layout")
    p.add_argument("--fast-decode", action="store_true", help="musetalk: the stage's fast_decode switch")
    p.add_argument("--compile-mode", default="", help="musetalk: the stage's --compile-mode")
    p.add_argument("--max-rel-error", type=float, default=None, help="musetalk: the stage's numerics guard bound")
    add_load_args(p, "lipsync")
    args = p.parse_args(argv)
    if args.warmup_seconds >= args.seconds:
        p.error("--warmup-seconds must be below --seconds")
    # `timeout` sends SIGTERM: unwind, so that the services are stopped and nothing holds the GPU after us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    missing = check_service_imports()
    if missing:
        print("the lipsync service cannot start here; missing: " + ", ".join(missing), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-lipsync-") as tmp:
        workdir = Path(tmp)
        if args.model == "musetalk":
            result, tail = serve_and_load(
                args,
                workdir,
                "lipsync-musetalk",
                musetalk_flags(args, workdir),
                lipsync_pb2_grpc.MuseTalkServiceStub,
                run_musetalk_stream,
                "frames",
            )
        elif not args.checkpoint and not args.procedural:
            args.checkpoint = str(workdir / "wav2lip-seeded.pth")
            write_seeded_checkpoint(Path(args.checkpoint))
        if args.model == "wav2lip":
            result, tail = serve_and_load(
                args, workdir, "lipsync", lipsync_flags(args), lipsync_pb2_grpc.LipSyncServiceStub, run_stream, "frames"
            )

    result.update(
        date=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        args={k: v for k, v in vars(args).items() if k != "checkpoint"},
        checkpoint=checkpoint_label(args),
    )
    print_result_table(args, result, "frames", {"tier": args.model})
    return report_errors_and_write(result, args, tail, "frames")


if __name__ == "__main__":
    sys.exit(main())
