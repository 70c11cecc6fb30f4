#!/usr/bin/env python
"""Sustained throughput of the superres service's Upscale RPC under concurrent streams.

Starts `python -m services.superres` as a subprocess (port 0 + --port-file, metrics off; --replicas
processes, --gpus to pin them), then opens --streams concurrent Upscale streams (grpc.aio, spread
over --procs client processes). Each stream sends messages of --items UpscaleItems for --seconds,
keeping at most --window messages in flight. An item is a 96x96 BGR24 crop (random pixels, cycled
from a pool of --pool crops made once per stream) to be returned at --out-size (default 192x192,
a typical face box at 720p: the x4 network's 384x384 output is resized on the service's device;
0 = the model's native size). Reports, like bench_lipsync_grpc.py (whose driver this reuses):

* sustained crops/s (response items received after --warmup-seconds, over the remaining send window);
* p50 / p99 per-message latency (request yielded to gRPC -> its response received);
* the service's batch size, *estimated* from response bursts split at gaps > --burst-gap-ms (the
  service never splits a message across batches, but bursts of different batches can still merge).

The issue's target: 8,000 crops/s on one H200 for SRVGGNetCompact x4 (32 convs) on 96-px crops.
At 192x192 each crop is 110 kB back (442 kB at the native 384x384): use --procs to keep the
Python clients from being the limit.

Weights: a seeded synthetic checkpoint of --model (default realesr-general-x4v3, i.e.
SRVGGNetCompact(num_conv=32, upscale=4)) is written to a temp dir in Real-ESRGAN's layout
({"params": ...}) unless --checkpoint is given (speed does not depend on the values); --lanczos
runs the weight-free resize instead. The service needs the same packages as the lipsync one.

Examples:
    python bench/bench_superres_grpc.py --device cpu --streams 2 --items 4 --seconds 8 --warmup-seconds 2 --max-batch 8
    python bench/bench_superres_grpc.py --device cuda --max-batch 128 --procs 4 --out var/bench/superres-grpc-h200.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import sys
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO_ROOT))

import grpc
import numpy as np

from bench.bench_lipsync_grpc import (
    Stats,
    add_load_args,
    check_service_imports,
    print_result_table,
    report_errors_and_write,
    serve_and_load,
    serving_flags,
)
from lipline.v1 import superres_pb2, superres_pb2_grpc
from services.media.wire import image_to_proto
from services.serving.streams import stream_call

CROP_SIDE = 96  # the lipsync stage's output


def write_seeded_checkpoint(path: Path, model_name: str) -> None:
    """`model_name`'s architecture with seeded weights, in Real-ESRGAN's file layout ({"params": ...})."""
    import torch

    from services.inference.checkpoints import seeded_state_dict
    from services.superres.models import create_sr_model

    torch.save({"params": seeded_state_dict(create_sr_model(model_name))}, path)


def parse_size(text: str) -> tuple[int, int]:
    """'192x160' -> (192, 160); '192' -> (192, 192); '0' -> (0, 0), the model's native size."""
    try:
        w, _, h = text.lower().partition("x")
        size = (int(w), int(h or w))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WxH, N or 0, got {text!r}") from None
    if min(size) < 0 or (0 in size and size != (0, 0)):
        raise argparse.ArgumentTypeError(f"sizes must be positive (or 0 for native), got {text!r}")
    return size


async def run_stream(
    stub: superres_pb2_grpc.SuperResServiceStub, sid: int, args: argparse.Namespace, stop_at: float, stats: Stats
) -> None:
    """One Upscale stream: messages of args.items crops until stop_at, args.window in flight."""
    rng = np.random.default_rng(sid)
    pool = [image_to_proto(rng.integers(0, 256, (CROP_SIDE, CROP_SIDE, 3), dtype=np.uint8)) for _ in range(args.pool)]
    out_w, out_h = args.out_size
    window = asyncio.Semaphore(args.window)
    sent: deque[float] = deque()

    async def requests() -> AsyncIterator[superres_pb2.UpscaleRequest]:
        index = 0
        while time.perf_counter() < stop_at:
            await window.acquire()
            items = [
                superres_pb2.UpscaleItem(index=i, image=pool[i % len(pool)], out_width=out_w, out_height=out_h)
                for i in range(index, index + args.items)
            ]
            index += args.items
            sent.append(time.perf_counter())
            yield superres_pb2.UpscaleRequest(items=items)

    checked = False
    try:
        call = stream_call(stub.Upscale, requests())  # a failure building the requests is raised here
        async for response in call:
            window.release()
            stats.received(sent.popleft(), len(response.items), response)
            if not checked:  # the first response: all items back, at the size asked for
                checked = True
                got = {(it.image.width, it.image.height) for it in response.items}
                if len(response.items) != args.items or (out_w and got != {(out_w, out_h)}):
                    stats.errors.append(
                        f"stream {sid}: asked {args.items} items at {out_w}x{out_h}, got {len(response.items)} at {sorted(got)}"
                    )
    except grpc.aio.AioRpcError as exc:
        stats.errors.append(f"stream {sid}: {exc.code().name}: {exc.details()}")


def superres_flags(args: argparse.Namespace) -> list[str]:
    """The superres-only service flags (start_service adds the common ones)."""
    if args.lanczos:
        return ["--model", "lanczos"]
    return ["--model", args.model, "--checkpoint", args.checkpoint, *serving_flags(args)]


def main(argv: Sequence[str] | None = None) -> int:
    from services.superres.models import SR_MODELS

    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--max-batch", type=int, default=128, help="service --max-batch (crops per forward pass)")
    p.add_argument("--max-delay-ms", type=float, default=5.0, help="service --max-delay-ms")
    p.add_argument("--model", default="realesr-general-x4v3", choices=sorted(SR_MODELS), help="service --model")
    p.add_argument("--checkpoint", default="", help="a Real-ESRGAN .pth of --model; default: a seeded synthetic one")
    p.add_argument("--lanczos", action="store_true", help="no network: the weight-free LANCZOS4 resize")
    p.add_argument("--streams", type=int, default=16, help="concurrent Upscale streams")
    p.add_argument("--items", type=int, default=32, help="crops per request message (the gateway sends 32)")
    p.add_argument("--pool", type=int, default=8, help="distinct random crops per stream")
    p.add_argument(
        "--out-size",
        type=parse_size,
        default=(192, 192),
        help="WxH (or N) each crop comes back at; 0 = the model's native size (384 for x4)",
    )
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for SERVING")
    add_load_args(p, "superres")
    args = p.parse_args(argv)
    if args.warmup_seconds >= args.seconds:
        p.error("--warmup-seconds must be below --seconds")
    if args.lanczos and args.checkpoint:
        p.error("--lanczos takes no --checkpoint")
    if args.items < 1 or args.pool < 1 or args.window < 1:
        p.error("--items, --pool and --window must be at least 1")

    missing = check_service_imports()
    if missing:
        print("the superres service cannot start here; missing: " + ", ".join(missing), file=sys.stderr)
        return 2
    seeded = not args.checkpoint and not args.lanczos
    with tempfile.TemporaryDirectory(prefix="bench-superres-") as tmp:
        workdir = Path(tmp)
        if seeded:
            args.checkpoint = str(workdir / f"{args.model}-seeded.pth")
            write_seeded_checkpoint(Path(args.checkpoint), args.model)
        result, tail = serve_and_load(
            args, workdir, "superres", superres_flags(args), superres_pb2_grpc.SuperResServiceStub, run_stream, "crops"
        )

    result.update(
        date=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        args={k: v for k, v in vars(args).items() if k != "checkpoint"},
        checkpoint="lanczos" if args.lanczos else ("seeded" if seeded else args.checkpoint),
    )
    out_w, out_h = args.out_size
    print_result_table(args, result, "crops", {"out size": f"{out_w}x{out_h}" if out_w else "native"})
    return report_errors_and_write(result, args, tail, "crops")


if __name__ == "__main__":
    sys.exit(main())
