#!/usr/bin/env python
"""Model-only throughput of the lipsync generator (Wav2Lip) and the SR net (SRVGGNetCompact x4).

One command; prints a markdown table and (with --out) writes the same rows as JSON. Each row is a
backend configuration (services.inference.backends.make_backend) measured at each batch size:

* `model items/s`: the backend's device-side call (inputs already on the device, output left
  there) timed with torch.cuda.synchronize + perf_counter over chunks of iterations for a fixed
  time budget per row (--seconds) after warm-up; the median chunk is reported.
* `e2e items/s`: the same backend called the way the service calls it (float32 CPU inputs in,
  float32 CPU output out: H2D + D2H copies included).
* `rel err`: ||out - ref|| / ||ref|| against a strict-fp32 reference (TF32 off) of the same model
  on the same inputs; `max Δu8`: the largest difference in uint8 levels (what a pasted face shows).

Weights are synthetic (services.inference.checkpoints.seeded_state_dict) unless --wav2lip-checkpoint
is given: speed does not depend on the values, but with seeded weights the outputs sit close to
0.5, so the error columns are a smoke test, not a quality statement.

`--model musetalk` measures the 256 px tier's networks as the lipsync-musetalk stage runs them
(services/lipsync/musetalk/networks.py): `musetalk` is the generator of one batch (positional
encoding, UNet at t = 0, VAE decode: latents [B, 8, 32, 32] + tokens [B, 50, 384] -> faces
[B, 3, 256, 256]), `whisper` the encoder on 30 s windows ([B, 80, 3000] -> [B, 1500, 5, 384]);
seeded checkpoints in the public formats (services/lipsync/musetalk/seeded.py) loaded through the stage's
loaders, at full size, or narrow with `--tiny` (a CPU's smoke run).

Examples:
    python bench/bench_models.py --device cpu --batch 2 --seconds 0.5
    python bench/bench_models.py --model musetalk --device cpu --tiny --batch 2 --seconds 0.5
    python bench/bench_models.py --model musetalk --device cuda --batch 16,32,64 --compile
    python bench/bench_models.py --device cuda --out var/bench/models-h200.json            # ~3 min
    python bench/bench_models.py --device cuda --compile --out var/bench/models-h200.json  # + compile
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # `python bench/bench_models.py` from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from services.inference.backends import Backend, CompiledBackend, make_backend, reference_output, relative_error
from services.inference.backends.numerics import cudnn_flag
from services.inference.checkpoints import seeded_state_dict

InputsFn = Callable[[int], tuple[torch.Tensor, ...]]


@dataclass
class Row:
    model: str
    row: str
    batch: int
    unit: str
    items_per_s: float | None = None
    ms_per_batch: float | None = None
    e2e_items_per_s: float | None = None
    rel_err: float | None = None
    max_abs_err_u8: float | None = None
    peak_mem_mb: float | None = None
    setup_s: float | None = None
    compile_s: float | None = None
    iterations: int = 0
    note: str = ""
    extra: dict = field(default_factory=dict)


@dataclass
class Config:
    name: str
    precision: str
    channels_last: bool = False
    fold_bn: bool = False
    cuda_graphs: bool = False
    cudnn_disabled: bool = False
    compile: bool = False
    gpu_only: bool = False


WAV2LIP_ROWS = [
    Config("fp32 eager", "fp32"),
    Config("fp32 eager, cuDNN disabled", "fp32", cudnn_disabled=True, gpu_only=True),
    Config("fp16 channels_last", "fp16", channels_last=True),
    Config("fp16 + BN folded", "fp16", channels_last=True, fold_bn=True),
    Config("fp16 + BN folded + CUDA graph", "fp16", channels_last=True, fold_bn=True, cuda_graphs=True, gpu_only=True),
    Config("bf16 + BN folded + CUDA graph", "bf16", channels_last=True, fold_bn=True, cuda_graphs=True, gpu_only=True),
    Config("torch.compile max-autotune (fp16, folded)", "fp16", channels_last=True, fold_bn=True, compile=True),
    Config(
        "torch.compile max-autotune + CUDA graph",
        "fp16",
        channels_last=True,
        fold_bn=True,
        compile=True,
        cuda_graphs=True,
        gpu_only=True,
    ),
]
#: the CUDA graph and compiled rows of a network without BatchNorm in channels_last (SRVGG, MuseTalk's UNet + VAE)
CHANNELS_LAST_FAST_ROWS = [
    Config("fp16 channels_last + CUDA graph", "fp16", channels_last=True, cuda_graphs=True, gpu_only=True),
    Config("torch.compile max-autotune (fp16)", "fp16", channels_last=True, compile=True),
    Config(
        "torch.compile max-autotune + CUDA graph",
        "fp16",
        channels_last=True,
        compile=True,
        cuda_graphs=True,
        gpu_only=True,
    ),
]
SR_ROWS = [Config("fp32", "fp32"), Config("fp16", "fp16"), *CHANNELS_LAST_FAST_ROWS]
MUSETALK_ROWS = [
    Config("fp32 eager", "fp32"),
    Config("fp16 channels_last", "fp16", channels_last=True),
    *CHANNELS_LAST_FAST_ROWS,
]
WHISPER_ROWS = [
    Config("fp32 eager", "fp32"),
    Config("fp16", "fp16"),
    Config("fp16 + CUDA graph", "fp16", cuda_graphs=True, gpu_only=True),
    Config("torch.compile max-autotune (fp16)", "fp16", compile=True),
]
#: what `--model` measures
MODEL_SETS = {"wav2lip": "wav2lip,srvgg", "musetalk": "musetalk,whisper"}


# --------------------------------------------------------------------------------------------------
# models and inputs
# --------------------------------------------------------------------------------------------------


def build_musetalk(folder: Path, tiny: bool) -> tuple[nn.Module, nn.Module]:
    """(generator, whisper encoder) from seeded checkpoints in the public formats, through the stage's loaders."""
    from services.lipsync.musetalk.networks import load_networks
    from services.lipsync.musetalk.seeded import write_seeded_networks

    paths = write_seeded_networks(folder, small=tiny)
    networks = load_networks(paths["unet"], paths["unet_config"], paths["vae"], paths["whisper"])
    return networks.generator.eval(), networks.encoder.eval()


def musetalk_inputs(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(77 + batch)
    return torch.randn(batch, 8, 32, 32, generator=gen) * 0.5, torch.randn(batch, 50, 384, generator=gen)


def whisper_inputs(batch: int) -> tuple[torch.Tensor]:
    gen = torch.Generator().manual_seed(55 + batch)
    return (torch.rand(batch, 80, 3000, generator=gen) * 2 - 0.8,)


def build_wav2lip(checkpoint: str | None) -> nn.Module:
    from services.lipsync.wav2lip import Wav2Lip, load_wav2lip

    if checkpoint:
        return load_wav2lip(checkpoint)
    model = Wav2Lip()
    model.load_state_dict(seeded_state_dict(model))
    return model.eval()


def wav2lip_inputs(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234 + batch)
    return torch.rand(batch, 1, 80, 16, generator=gen) * 8 - 4, torch.rand(batch, 6, 96, 96, generator=gen)


def build_srvgg() -> nn.Module:
    from services.superres.models import create_sr_model

    model = create_sr_model("realesr-general-x4v3")
    state = seeded_state_dict(model)
    # PReLU slopes ~0.25 like the trained nets (seeded draws are ~N(0, 0.02)).
    state = {k: (v + 0.25 if ".weight" in k and v.dim() == 1 else v) for k, v in state.items()}
    model.load_state_dict(state)
    return model.eval()


def sr_inputs_fn(size: int) -> InputsFn:
    def fn(batch: int) -> tuple[torch.Tensor]:
        gen = torch.Generator().manual_seed(99 + batch)
        return (torch.rand(batch, 3, size, size, generator=gen),)

    return fn


# --------------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], object], device: torch.device, seconds: float, warmup_iters: int) -> tuple[float, int]:
    """Median seconds per call over chunks of back-to-back calls filling `seconds`; (median, calls)."""
    for _ in range(warmup_iters):
        fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    one = max(time.perf_counter() - t0, 1e-6)
    # Chunks of ~1/8 of the budget (at least one call): few syncs, several samples for the median.
    per_chunk = max(1, int(seconds / 8 / one))
    samples: list[float] = []
    calls = 0
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        for _ in range(per_chunk):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - t0) / per_chunk)
        calls += per_chunk
        if time.perf_counter() - start >= seconds:
            break
    return statistics.median(samples), calls


def make_row_backend(
    cfg: Config, model: nn.Module, device: torch.device, batches: Sequence[int], args: argparse.Namespace
) -> Backend:
    common = dict(
        precision=cfg.precision, channels_last=cfg.channels_last, fold_bn=cfg.fold_bn, batch_buckets=tuple(batches)
    )
    if cfg.compile:
        return make_backend(
            "compile",
            copy.deepcopy(model),
            device,
            cache_dir=args.cache_dir,
            compile_mode=args.compile_mode,
            cuda_graphs=cfg.cuda_graphs,
            **common,
        )
    return make_backend("torch", copy.deepcopy(model), device, cuda_graphs=cfg.cuda_graphs, **common)


def bench_model(
    label: str,
    unit: str,
    model: nn.Module,
    inputs_fn: InputsFn,
    rows: Sequence[Config],
    batches: Sequence[int],
    device: torch.device,
    args: argparse.Namespace,
) -> list[Row]:
    results: list[Row] = []
    check_batch = min(batches)
    check_inputs = inputs_fn(check_batch)
    t0 = time.perf_counter()
    reference = reference_output(model, check_inputs, device)
    print(f"[{label}] fp32 reference at batch {check_batch} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    for cfg in rows:
        if cfg.compile and not args.compile:
            results.append(Row(label, cfg.name, 0, unit, note="skipped: pass --compile (takes minutes)"))
            continue
        if cfg.gpu_only and device.type != "cuda":
            results.append(Row(label, cfg.name, 0, unit, note="skipped: needs CUDA"))
            continue
        if args.rows and not any(r.lower() in cfg.name.lower() for r in args.rows):
            continue
        print(f"[{label}] {cfg.name} ...", file=sys.stderr)
        backend = None
        try:
            with cudnn_flag("enabled", False) if cfg.cudnn_disabled else contextlib.nullcontext():
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                t0 = time.perf_counter()
                backend = make_row_backend(cfg, model, device, batches, args)
                setup = time.perf_counter() - t0
                t0 = time.perf_counter()
                backend.warmup(
                    inputs_fn
                )  # every bucket (= the batches): graphs captured / compiled here, largest first
                warm = time.perf_counter() - t0
                out = backend(*check_inputs)
                err = relative_error(out, reference)
                du8 = float((out.double() - reference.double()).abs().max()) * 255.0
                compile_s = backend.compile_seconds if isinstance(backend, CompiledBackend) else None
                for b in batches:
                    cpu_in = inputs_fn(b)
                    dev_in = tuple(x.to(device) for x in cpu_in)
                    med, calls = time_calls(
                        lambda: backend.forward_device(*dev_in), device, args.seconds, args.warmup_iters
                    )
                    e2e = None
                    if not args.no_e2e:
                        e2e_med, _ = time_calls(lambda: backend(*cpu_in), device, args.seconds / 2, 1)
                        e2e = b / e2e_med
                    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
                    results.append(
                        Row(
                            label,
                            cfg.name,
                            b,
                            unit,
                            items_per_s=b / med,
                            ms_per_batch=med * 1e3,
                            e2e_items_per_s=e2e,
                            rel_err=err,
                            max_abs_err_u8=du8,
                            peak_mem_mb=peak,
                            setup_s=setup + warm,
                            compile_s=compile_s,
                            iterations=calls,
                            extra={"backend": backend.describe()},
                        )
                    )
                    print(f"    batch {b}: {b / med:,.1f} {unit}/s ({med * 1e3:.2f} ms)", file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
            traceback.print_exc()
            results.append(Row(label, cfg.name, 0, unit, note=f"FAILED: {type(exc).__name__}: {exc}"[:300]))
        finally:
            backend = None  # drop the model before the next row (not `del`: the timing lambdas close over it)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return results


# --------------------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------------------


def environment(device: torch.device) -> dict:
    env = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": str(device),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            gpu_memory_gb=round(props.total_memory / 2**30, 1),
            sm_count=props.multi_processor_count,
        )
    try:
        import tensorrt

        env["tensorrt"] = tensorrt.__version__
    except Exception:  # noqa: BLE001
        env["tensorrt"] = None
    return env


def _fmt(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def markdown(rows: Sequence[Row], env: dict) -> str:
    lines = []
    head = f"{env.get('gpu') or env['cpu']} ({env['device']}), torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}"
    lines.append(f"**{head}**, {env['date']}\n")
    lines.append(
        "| model | row | batch | model items/s | ms/batch | e2e items/s | rel err | max Δu8 | peak MiB | warm-up s | compile s | note |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        lines.append(
            f"| {r.model} | {r.row} | {r.batch or ''} | {_fmt(r.items_per_s, ',.1f')} {r.unit if r.items_per_s else ''} | "
            f"{_fmt(r.ms_per_batch, '.2f')} | {_fmt(r.e2e_items_per_s, ',.1f')} | {_fmt(r.rel_err, '.2e')} | "
            f"{_fmt(r.max_abs_err_u8, '.2f')} | {_fmt(r.peak_mem_mb, ',.0f')} | {_fmt(r.setup_s, '.1f')} | "
            f"{_fmt(r.compile_s, '.1f')} | {r.note} |"
        )
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--batch", type=_ints, default=None, help="Wav2Lip batch sizes (default 32,128,256 on GPU; 4 on CPU)"
    )
    p.add_argument(
        "--sr-batch", type=_ints, default=None, help="SR batch sizes (default 32,128 on GPU; the --batch list on CPU)"
    )
    p.add_argument("--sr-size", type=int, default=96, help="SR input crop side (pixels)")
    p.add_argument("--seconds", type=float, default=3.0, help="timed budget per row and batch size")
    p.add_argument("--warmup-iters", type=int, default=3)
    p.add_argument("--model", default="", choices=["", *MODEL_SETS], help="a tier's networks (sets --models)")
    p.add_argument("--models", default="wav2lip,srvgg", help="comma list: wav2lip, srvgg, musetalk, whisper")
    p.add_argument("--tiny", action="store_true", help="musetalk: narrow seeded networks (a CPU's smoke run)")
    p.add_argument("--whisper-batch", type=_ints, default=None, help="whisper windows per pass (default 1,4,16 on GPU)")
    p.add_argument("--rows", default="", help="comma list of substrings: only rows whose name contains one")
    p.add_argument("--compile", action="store_true", help="add the torch.compile row (minutes per batch size)")
    p.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    p.add_argument("--cache-dir", default="var/compile-cache", help="torch.compile cache artifacts (per key)")
    p.add_argument("--wav2lip-checkpoint", default=None, help="real weights instead of seeded ones")
    p.add_argument("--no-e2e", action="store_true", help="skip the CPU-in/CPU-out measurement")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--out", default=None, help="write the rows and environment as JSON here")
    args = p.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no CUDA GPU")
    device = torch.device(
        "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    gpu = device.type == "cuda"
    batches = args.batch or ([32, 128, 256] if gpu else [4])
    sr_batches = args.sr_batch or ([32, 128] if gpu else batches)
    env = environment(device)
    print(json.dumps(env), file=sys.stderr)

    rows: list[Row] = []
    models = {m.strip() for m in (MODEL_SETS[args.model] if args.model else args.models).split(",")}
    if models & {"musetalk", "whisper"}:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="bench-musetalk-") as folder:
            generator, encoder = build_musetalk(Path(folder), args.tiny)
        label = "musetalk" + (" (tiny)" if args.tiny else "")
        if "musetalk" in models:
            rows += bench_model(label, "frames", generator, musetalk_inputs, MUSETALK_ROWS, batches, device, args)
        if "whisper" in models:
            windows = args.whisper_batch or ([1, 4, 16] if gpu else [1])
            rows += bench_model(
                "whisper-tiny encoder", "windows", encoder, whisper_inputs, WHISPER_ROWS, windows, device, args
            )
    if "wav2lip" in models:
        rows += bench_model(
            "wav2lip",
            "frames",
            build_wav2lip(args.wav2lip_checkpoint),
            wav2lip_inputs,
            WAV2LIP_ROWS,
            batches,
            device,
            args,
        )
    if "srvgg" in models:
        rows += bench_model(
            f"srvgg-x4-c32 {args.sr_size}px",
            "crops",
            build_srvgg(),
            sr_inputs_fn(args.sr_size),
            SR_ROWS,
            sr_batches,
            device,
            args,
        )

    table = markdown(rows, env)
    print(table)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    "environment": env,
                    "args": {k: v for k, v in vars(args).items()},
                    "rows": [asdict(r) for r in rows],
                    "markdown": table,
                },
                indent=2,
            )
        )
        print(f"wrote {out}", file=sys.stderr)
    failed = [r for r in rows if r.note.startswith("FAILED")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
