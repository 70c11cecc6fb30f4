#!/usr/bin/env python
"""Where one superres batch spends its time, step by step (no gRPC server, no event loop).

The superres service reaches about half of the bare network's crops/s through gRPC (H200: 3,584 vs
6,534 with one replica). This times, for one batch of --batch 96x96 crops returned at --out-size,
the steps `SuperResService.Upscale` and `SuperResEngine.run` take per batch: parsing the request
messages and decoding their images, grouping them into chunks, the upload, the network alone
(`forward_device`, input already on the device), the whole `engine.run` (upload, network, output
maths, Lanczos resize, one copy back, one bytes object per crop), and building and serialising the
response messages. The steps that run on the event loop and those on the model thread share one
GIL, so their sum is what one process can do at most.

Examples:
    python bench/bench_superres_stages.py --device cpu --batch 8 --repeats 2
    python bench/bench_superres_stages.py --device cuda --batch 128
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from bench.bench_lipsync_stages import add_stage_args, device_and_batch, report, timed
from bench.bench_superres_grpc import parse_size
from lipline.v1 import superres_pb2
from services.inference.backends import make_backend
from services.media.wire import image_from_proto, image_to_proto
from services.superres.engine import SuperResEngine, UpscaleChunk
from services.superres.models import create_sr_model
from services.superres.service import upscale_response
from services.superres.upscaler import ModelUpscaler

ITEMS_PER_MESSAGE = 32  # what the gateway sends


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_stage_args(p, "crops", 128, 8)
    p.add_argument("--out-size", type=parse_size, default=(192, 192), help="WxH each crop comes back at")
    args = p.parse_args(argv)
    device, batch = device_and_batch(args, 128, 8)

    torch.manual_seed(0)
    network = create_sr_model("realesr-general-x4v3")  # seeded random weights: speed does not depend on them
    upscaler = ModelUpscaler(network, scale=4)  # fp32 on the CPU, as the service: the backend holds the device copy
    backend = make_backend(args.backend, upscaler.model, device, max_batch=batch, batch_buckets=(batch,))
    engine = SuperResEngine(upscaler, device, max_batch=batch, backend=backend)
    engine.warmup(batch, (96, 96), args.out_size)

    rng = np.random.default_rng(0)
    crops = [rng.integers(0, 256, (96, 96, 3), dtype=np.uint8) for _ in range(batch)]
    sizes = [args.out_size] * batch
    requests = [
        superres_pb2.UpscaleRequest(
            items=[
                superres_pb2.UpscaleItem(
                    index=i, image=image_to_proto(crops[i]), out_width=args.out_size[0], out_height=args.out_size[1]
                )
                for i in range(start, min(start + ITEMS_PER_MESSAGE, batch))
            ]
        ).SerializeToString()
        for start in range(0, batch, ITEMS_PER_MESSAGE)
    ]
    chunks = [
        UpscaleChunk.from_items(crops[s : s + ITEMS_PER_MESSAGE], sizes[s : s + ITEMS_PER_MESSAGE])
        for s in range(0, batch, ITEMS_PER_MESSAGE)
    ]
    results = engine.run(chunks)
    x = torch.rand(batch, 3, 96, 96, generator=torch.Generator().manual_seed(0)).to(device, engine.dtype)
    if engine.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    def parse_and_decode() -> None:
        for data in requests:
            for item in superres_pb2.UpscaleRequest.FromString(data).items:
                image_from_proto(item.image)

    def respond() -> None:
        for result in results:
            upscale_response((list(range(len(result))),), result).SerializeToString()

    r = args.repeats
    rows: dict[str, float] = {
        "event loop: parse requests + decode images": timed(parse_and_decode, device, r),
        "event loop: UpscaleChunk.from_items": timed(
            lambda: [
                UpscaleChunk.from_items(crops[s : s + ITEMS_PER_MESSAGE], sizes[s : s + ITEMS_PER_MESSAGE])
                for s in range(0, batch, ITEMS_PER_MESSAGE)
            ],
            device,
            r,
        ),
        "model thread: engine.run (upload, network, maths, resize, copy back, bytes)": timed(
            lambda: engine.run(chunks), device, r
        ),
        "event loop: build + serialise responses": timed(respond, device, r),
    }
    serial = sum(rows.values())
    rows["(inside engine.run) network alone, input on the device"] = timed(lambda: backend.forward_device(x), device, r)
    report(
        f"batch {batch} of 96x96 -> {args.out_size[0]}x{args.out_size[1]} on {device} ({backend.describe()}), median of {r}:",
        rows,
        serial,
        batch,
        "crops",
        args.out,
        device=str(device),
        backend=backend.describe(),
        out_size=list(args.out_size),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
