#!/usr/bin/env python
"""Live sessions' faces over FaceLink: N fake sessions at 25 fps against a lipsync stage.

Each client process is one live worker: one FaceLink (one Generate stream) and its share of the
--sessions. Every session submits one item per frame on its own clock (a random phase within the
frame), with its own reference crops (or, with --shared, one avatar's), a random mel window, and a
due time --due-ms after submission (the face may be --late-frames frames later than that, then it is
skipped). Nothing waits for a face before the next frame: a slow stage shows as latency and skips.

Reports, over the time after --warmup-seconds: messages/s and items per message (the multiplexing:
one message per tick per worker carries every session's frame), faces/s, face latency p50/p95/p99
(submit -> face back), skipped frames (late, stream errors), and the client's CPU per session.

Against a running stage (`--address host:port`), or one this script starts (`python -m
services.lipsync` on port 0, bench_lipsync_grpc.py's flags: --device, --max-batch, --procedural or a
seeded synthetic Wav2Lip checkpoint).

Examples:
    python bench/bench_live_link.py --device cpu --procedural --sessions 8 --seconds 6 --warmup-seconds 2
    python bench/bench_live_link.py --device cuda --sessions 400 --procs 4 --seconds 30 --out var/bench/live-link-h200.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import multiprocessing
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np

from lipline.v1 import lipsync_pb2_grpc
from services.live.face_link import FaceLate, FaceLink, FaceLinkSettings, ReferenceFace
from services.serving.channels import StageFailed, open_channel


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def run_worker(address: str, first_session: int, sessions: int, args: argparse.Namespace) -> dict:
    """One live worker's link and its sessions for args.seconds; raw statistics of the measured window."""
    rng = np.random.default_rng(first_session)
    settings = FaceLinkSettings(
        fps=args.fps,
        flush_interval_s=args.flush_ms / 1000 if args.flush_ms else None,
        max_items_per_message=args.max_items,
        late_frames=args.late_frames,
    )
    items_per_message: list[int] = []
    latencies: list[float] = []
    skipped = {"late": 0, "failed": 0}
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.5  # every session registered, crops sent, before the first frame
    measure_from = start + args.warmup_seconds
    stop_at = start + args.seconds

    def on_message(stage: str, items: int) -> None:
        if loop.time() >= measure_from:
            items_per_message.append(items)

    channel = open_channel(address, 64 * 2**20)
    link = FaceLink(lipsync_pb2_grpc.LipSyncServiceStub(channel), None, settings, on_message=on_message)
    crops_per_session = args.crops
    paste = (args.paste, args.paste)

    def crops_of(session: int) -> list[ReferenceFace]:
        seed = 0 if args.shared else session
        images = np.random.default_rng(seed).integers(0, 256, (crops_per_session, 96, 96, 3), dtype=np.uint8)
        return [ReferenceFace(image, *paste) for image in images]

    mels = rng.uniform(-4, 0, (64, 80, 16)).astype(np.float32)

    async def session(key: int) -> None:
        period = 1.0 / args.fps
        next_frame = start + random.Random(key).random() * period
        frame = 0
        pending: set[asyncio.Future] = set()
        while next_frame < stop_at:
            await asyncio.sleep(max(0.0, next_frame - loop.time()))
            submitted = loop.time()
            future = link.submit(
                key,
                frame,
                frame % crops_per_session,
                mels[(key + frame) % len(mels)],
                due=submitted + args.due_ms / 1000,
            )
            measured = submitted >= measure_from

            def done(f: asyncio.Future, submitted: float = submitted, measured: bool = measured) -> None:
                pending.discard(f)
                if f.cancelled():
                    return
                error = f.exception()  # retrieved even in the warm-up (asyncio logs one never retrieved)
                if not measured:
                    return
                if error is None:
                    latencies.append(loop.time() - submitted)
                elif isinstance(error, FaceLate):
                    skipped["late"] += 1
                elif isinstance(error, StageFailed):
                    skipped["failed"] += 1
                else:
                    raise error

            pending.add(future)
            future.add_done_callback(done)
            frame += 1
            next_frame += period
        if pending:
            await asyncio.wait(pending, timeout=5.0)

    async with link:
        for s in range(first_session, first_session + sessions):
            link.register(s, crops_of(s), shared_as="avatar" if args.shared else None)
        tasks = [asyncio.create_task(session(s)) for s in range(first_session, first_session + sessions)]
        await asyncio.sleep(max(0.0, measure_from - loop.time()))
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(max(0.0, stop_at - loop.time()))
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.gather(*tasks)
        counters = dict(vars(link.counters))
    await channel.close()
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    return {
        "sessions": sessions,
        "latencies": latencies,
        "items_per_message": items_per_message,
        "skipped": skipped,
        "cpu_s": cpu,
        "counters": counters,
        "measured_s": args.seconds - args.warmup_seconds,
    }


def _worker_process(address: str, first_session: int, sessions: int, args: argparse.Namespace) -> dict:
    return asyncio.run(run_worker(address, first_session, sessions, args))


def load(address: str, args: argparse.Namespace) -> dict:
    """Spread the sessions over args.procs worker processes (one link each); the merged statistics."""
    shares = [args.sessions // args.procs + (1 if i < args.sessions % args.procs else 0) for i in range(args.procs)]
    firsts = [sum(shares[:i]) for i in range(args.procs)]
    if args.procs == 1:
        results = [_worker_process(address, 0, shares[0], args)]
    else:
        with multiprocessing.get_context("spawn").Pool(args.procs) as pool:
            results = pool.starmap(_worker_process, [(address, f, n, args) for f, n in zip(firsts, shares) if n])
    seconds = args.seconds - args.warmup_seconds
    latencies = [x for r in results for x in r["latencies"]]
    items = [x for r in results for x in r["items_per_message"]]
    skipped = {k: sum(r["skipped"][k] for r in results) for k in ("late", "failed")}
    cpu = sum(r["cpu_s"] for r in results)
    return {
        "sessions": args.sessions,
        "workers": len(results),
        "messages_per_s": len(items) / seconds,
        "items_per_message_mean": statistics.fmean(items) if items else 0.0,
        "items_per_message_p50": percentile(items, 50),
        "faces_per_s": len(latencies) / seconds,
        "expected_faces_per_s": args.sessions * args.fps,
        "latency_ms": {f"p{q}": 1000 * percentile(latencies, q) for q in (50, 95, 99)},
        "skipped": skipped,
        "skipped_fraction": sum(skipped.values()) / max(1, sum(skipped.values()) + len(latencies)),
        "client_cpu_ms_per_session_s": 1000 * cpu / seconds / max(1, args.sessions),
        "stream_errors": sum(r["counters"]["stream_errors"] for r in results),
        # items the link did not send because the stage could not answer them in time (whole run)
        "shed": sum(r["counters"].get("shed", 0) for r in results),
    }


def start_stage(args: argparse.Namespace, workdir: Path):  # -> ServiceProcess
    from bench.bench_lipsync_grpc import check_service_imports, lipsync_flags, start_service, write_seeded_checkpoint

    missing = check_service_imports()
    if missing:
        raise SystemExit("the lipsync service cannot start here; missing: " + ", ".join(missing))
    if not args.checkpoint and not args.procedural:
        args.checkpoint = str(workdir / "wav2lip-seeded.pth")
        write_seeded_checkpoint(Path(args.checkpoint))
    # start_service's sizing: streams and in-flight items of one stream (a worker's link: every session's frames).
    stage_args = argparse.Namespace(**vars(args), streams=args.procs, items=args.max_items, window=8, gpus="")
    for flag in ("backend", "batch_buckets", "pipeline_depth", "compile_cache_dir", "precision"):
        setattr(stage_args, flag, getattr(args, flag, "") or "")
    process = start_service(stage_args, workdir, flags=lipsync_flags(stage_args))
    process.wait_ready(args.startup_timeout)
    return process


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--address", default="", help="a running lipsync stage; default: start one")
    p.add_argument("--sessions", type=int, default=16, help="fake live sessions, all speaking")
    p.add_argument(
        "--procs",
        type=int,
        default=1,
        help="live workers (client processes, one link each) the sessions are spread over",
    )
    p.add_argument("--fps", type=float, default=25.0)
    p.add_argument("--seconds", type=float, default=20.0, help="how long each session sends")
    p.add_argument("--warmup-seconds", type=float, default=3.0, help="excluded from the statistics")
    p.add_argument("--flush-ms", type=float, default=0.0, help="the link's send interval; 0 = one frame")
    p.add_argument("--max-items", type=int, default=128, help="the link sends at once at this many queued items")
    p.add_argument("--due-ms", type=float, default=160.0, help="each face is due this long after its item is submitted")
    p.add_argument("--late-frames", type=float, default=2.0, help="frames past due before a face is skipped")
    p.add_argument("--crops", type=int, default=8, help="reference crops per session")
    p.add_argument("--shared", action="store_true", help="every session uses one avatar's crops (sent once per link)")
    p.add_argument("--paste", type=int, default=192, help="paste size of the faces (a 512x512 avatar's face box)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="started stage: --device")
    p.add_argument("--max-batch", type=int, default=128, help="started stage: --max-batch")
    p.add_argument("--max-delay-ms", type=float, default=5.0, help="started stage: --max-delay-ms")
    p.add_argument("--checkpoint", default="", help="started stage: a wav2lip.pth; default a seeded synthetic one")
    p.add_argument("--procedural", action="store_true", help="started stage: the weight-free stand-in model")
    p.add_argument("--precision", default="", help="started stage: --precision")
    p.add_argument("--log-level", default="WARNING", help="started stage: log level")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.warmup_seconds >= args.seconds:
        p.error("--warmup-seconds must be below --seconds")
    if not 1 <= args.procs <= args.sessions:
        p.error("--procs must be in 1..--sessions")

    process = None
    with tempfile.TemporaryDirectory(prefix="bench-live-link-") as tmp:
        try:
            address = args.address
            if not address:
                process = start_stage(args, Path(tmp))
                address = process.address
            started = time.monotonic()
            result = load(address, args)
            result["wall_s"] = time.monotonic() - started
        finally:
            if process is not None:
                process.terminate()
    result.update(
        date=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        args={k: v for k, v in vars(args).items() if k != "checkpoint"},
        model="procedural"
        if args.procedural
        else ("seeded" if "wav2lip-seeded" in (args.checkpoint or "") else args.checkpoint or "stage's own"),
    )
    lat = result["latency_ms"]
    print(
        "| sessions | workers | messages/s | items/message | faces/s (of) | latency p50 / p95 / p99 ms "
        "| skipped late / failed (shed, whole run) | client CPU ms / session-s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {result['sessions']} | {result['workers']} | {result['messages_per_s']:.1f} | {result['items_per_message_mean']:.1f} | "
        f"{result['faces_per_s']:.0f} ({result['expected_faces_per_s']:.0f}) | {lat['p50']:.1f} / {lat['p95']:.1f} / {lat['p99']:.1f} | "
        f"{result['skipped']['late']} / {result['skipped']['failed']} ({result['shed']}) | {result['client_cpu_ms_per_session_s']:.2f} |"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
