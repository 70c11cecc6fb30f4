#!/usr/bin/env python
"""Where one lipsync model batch spends its time, stage by stage (no gRPC, no event loop).

Times, for one batch, each step `LipSyncService`'s Generate path runs per batch: mel decode,
`prep.model_inputs` (numpy mask + float conversion), the backend call (H2D, model, D2H),
`prep.to_uint8_faces`, and `image_to_proto` per face. For comparison it also times a device-side
variant (uint8 faces to the GPU, `prep.model_inputs_torch` there, uint8 conversion there, 8x
fewer bytes over PCIe) that the service could adopt. Use it to explain the gap between
bench_models.py (model only) and bench_lipsync_grpc.py (whole service).

Examples:
    python bench/bench_lipsync_stages.py --device cpu --batch 4 --repeats 2
    python bench/bench_lipsync_stages.py --device cuda --batch 256
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from services.inference.backends import make_backend
from services.inference.checkpoints import seeded_state_dict
from services.lipsync import prep
from services.lipsync.wav2lip import Wav2Lip
from services.media.wire import image_to_proto, mel_from_bytes, mel_to_bytes


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of `fn` (synchronised) over `repeats` calls after one warm-up call."""
    fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(samples))


def add_stage_args(p: argparse.ArgumentParser, unit: str, gpu_batch: int, cpu_batch: int) -> None:
    """The flags both per-step benchmarks take."""
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--batch", type=int, default=None, help=f"{unit} per batch; default {gpu_batch} on GPU, {cpu_batch} on CPU"
    )
    p.add_argument("--backend", default="auto", help="backend kind (auto, cpu, torch, compile)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default=None)


def device_and_batch(args: argparse.Namespace, gpu_batch: int, cpu_batch: int) -> tuple[torch.device, int]:
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    return device, args.batch or (gpu_batch if use_cuda else cpu_batch)


def report(
    title: str, rows: dict[str, float], serial: float, batch: int, unit: str, out: str | None, **extra: object
) -> None:
    """Print the per-step table (ms per batch, `unit`/s if that step ran alone) and write --out JSON."""
    print(title)
    print(f"| step | ms per batch | {unit}/s if alone |")
    print("|---|---:|---:|")
    for k, v in rows.items():
        print(f"| {k} | {v:.2f} | {batch / v * 1e3:,.0f} |")
    print(f"| sum of the serial steps (one process, one GIL) | {serial:.2f} | {batch / serial * 1e3:,.0f} |")
    if out:
        Path(out).write_text(json.dumps({"batch": batch, **extra, "ms": rows, "serial_ms": serial}, indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_stage_args(p, "frames", 256, 4)
    args = p.parse_args(argv)
    device, batch = device_and_batch(args, 256, 4)

    model = Wav2Lip()
    model.load_state_dict(seeded_state_dict(model))
    backend = make_backend(args.backend, model.eval(), device, max_batch=batch, batch_buckets=(batch,))
    backend.warmup(lambda n: (torch.full((n, 1, 80, 16), -4.0), torch.zeros(n, 6, 96, 96)))

    rng = np.random.default_rng(0)
    faces = rng.integers(0, 256, (batch, 96, 96, 3), dtype=np.uint8)
    mel_bytes = [mel_to_bytes(rng.uniform(-4, 0, (80, 16)).astype(np.float32)) for _ in range(batch)]
    mels = np.stack([mel_from_bytes(b) for b in mel_bytes])
    face_t = torch.from_numpy(prep.model_inputs(faces))
    mel_t = torch.from_numpy(prep.mel_inputs(mels))
    out = backend(mel_t, face_t).numpy()
    u8 = prep.to_uint8_faces(out)
    r = args.repeats

    rows: dict[str, float] = {
        "mel_from_bytes x B": timed(lambda: [mel_from_bytes(b) for b in mel_bytes], device, r),
        "np.stack faces": timed(lambda: np.stack(list(faces)), device, r),
        "prep.model_inputs (numpy)": timed(lambda: prep.model_inputs(faces), device, r),
        "prep.mel_inputs": timed(lambda: prep.mel_inputs(mels), device, r),
        "backend call (H2D + model + D2H, fp32 I/O)": timed(lambda: backend(mel_t, face_t), device, r),
        "prep.to_uint8_faces (numpy)": timed(lambda: prep.to_uint8_faces(out), device, r),
        "image_to_proto x B": timed(lambda: [image_to_proto(f) for f in u8], device, r),
    }
    serial = sum(rows.values())
    if device.type == "cuda":

        def device_side() -> np.ndarray:
            f = torch.from_numpy(faces).to(device, non_blocking=True)
            m = mel_t.to(device, non_blocking=True)
            y = backend.forward_device(m, prep.model_inputs_torch(f))
            # Truncation like prep.to_uint8_faces, done on the GPU; 27 KB per face back instead of 110 KB.
            return (y.float() * 255.0).clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().cpu().numpy()

        rows["device-side alternative: uint8 in, prep + model + uint8 out on GPU"] = timed(device_side, device, r)
        mel_d, face_d = mel_t.to(device), face_t.to(device)
        rows["model only (forward_device, inputs already on GPU)"] = timed(
            lambda: backend.forward_device(mel_d, face_d), device, r
        )
    report(
        f"batch {batch} on {device} ({backend.describe()}), median of {r}:",
        rows,
        serial,
        batch,
        "frames",
        args.out,
        device=str(device),
        backend=backend.describe(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
