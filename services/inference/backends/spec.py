"""The one backend decision: `resolve_backend_spec()` turns a stage's settings into a `BackendSpec`.

Everything a backend's constructor would otherwise default on its own is decided here, once:
the kind (`auto` resolved), the device, the precision, the batch buckets, channels_last, BatchNorm
folding, CUDA graphs, the torch.compile mode and the compile cache key/path. The decision is logged
in one line (`BackendSpec.decision`) and handed to the backend, whose constructor only reads it
(the way text-generation-inference's launcher resolves its CUDA-graph sizes in one `match`).

Kinds:

* `cpu`      - eager fp32 on the CPU (the spec's kind is `torch`, its name `cpu`).
* `torch`    - eager on CUDA: fp16 + channels_last by default; fold_bn and cuda_graphs on request.
* `compile`  - `torch.compile` over the same options; its cache artifacts live at `cache_path`.
* `tensorrt` - an ONNX -> TensorRT engine (where the `tensorrt` package is importable).
* `auto`     - CUDA: `compile` when its cache artifacts for this model and these options are on
               disk (a warm start), else `torch` + fold_bn + CUDA graphs; CPU: `cpu`.

Batch buckets (the rule lives here and nowhere else): a batch of n rows is padded with zero rows
to `bucket_for(buckets, n)`, the smallest bucket >= n; batches above the largest bucket are split
into chunks of it. The model only ever sees a few static shapes: a precondition for CUDA graphs and
static-shape compilation, and what keeps cuDNN's benchmark cache small. Warm-up runs every bucket,
largest first (`warmup_batches`), or one row without buckets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import logging
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "BACKEND_KINDS",
    "DEFAULT_BUCKETS",
    "DEFAULT_COMPILE_MODE",
    "PRECISIONS",
    "BackendSpec",
    "auto_kind",
    "bucket_for",
    "compile_cache_key",
    "compile_mode_allows_graphs",
    "default_buckets",
    "resolve_backend_spec",
]

_LOGGER = logging.getLogger("services.inference.backends")

PRECISIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
BACKEND_KINDS = ("auto", "cpu", "torch", "compile", "tensorrt")
DEFAULT_COMPILE_MODE = "max-autotune-no-cudagraphs"
# Padding waste is at most 2x between neighbours; the shared graph pool makes extra buckets cheap.
DEFAULT_BUCKETS: tuple[int, ...] = (8, 16, 32, 64, 128, 256)


# ---------------------------------------------------------------------------------------------------
# The bucket rule
# ---------------------------------------------------------------------------------------------------


def default_buckets(max_batch: int | None = None) -> tuple[int, ...]:
    """DEFAULT_BUCKETS below `max_batch`, plus `max_batch` itself (so a full batch is never padded)."""
    if not max_batch:
        return DEFAULT_BUCKETS
    return tuple(b for b in DEFAULT_BUCKETS if b < max_batch) + (int(max_batch),)


def normalise_buckets(buckets: Sequence[int] | None) -> tuple[int, ...]:
    """Sorted, de-duplicated, positive bucket sizes (ValueError otherwise)."""
    out = tuple(sorted({int(b) for b in (buckets or ())}))
    if any(b <= 0 for b in out):
        raise ValueError(f"batch buckets must be positive, got {list(buckets or ())}")
    return out


def bucket_for(buckets: Sequence[int], n: int) -> int:
    """The padded batch size for n rows: the smallest bucket >= n, at most the largest; n without buckets."""
    for b in buckets:
        if b >= n:
            return b
    return buckets[-1] if buckets else n


# ---------------------------------------------------------------------------------------------------
# The compile cache key
# ---------------------------------------------------------------------------------------------------


def _state_hash(module: nn.Module) -> str:
    h = hashlib.sha256(type(module).__qualname__.encode())
    for key, value in module.state_dict().items():
        t = value.detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def _device_tag(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} sm{major}{minor} cuda{torch.version.cuda}"
    return f"cpu {platform.machine()} {platform.processor()}"


def compile_cache_key(
    module: nn.Module, device: torch.device, precision: str, buckets: Sequence[int], extra: str = ""
) -> str:
    """sha256 of (model state, torch version, GPU name/capability, precision, buckets, extra)."""
    parts = [_state_hash(module), torch.__version__, _device_tag(device), precision, ",".join(map(str, buckets)), extra]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def compile_mode_allows_graphs(mode: str) -> bool:
    """True for torch.compile modes without Inductor's own CUDA graphs (which must not be nested in ours)."""
    return mode in ("default", "max-autotune-no-cudagraphs")


def _tensorrt_version() -> str:
    try:
        from importlib.metadata import version

        return version("tensorrt")
    except Exception:  # noqa: BLE001 - only part of a cache key
        return "?"


# ---------------------------------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """Everything a backend is built from; made by `resolve_backend_spec`, read by the constructors.

    Attributes:
        kind: "torch", "compile" or "tensorrt" (`auto` and `cpu` are resolved away).
        device: where the model runs.
        precision: "fp32", "fp16" or "bf16".
        buckets: batch sizes a batch is padded up to (see the module docstring); () = no padding.
        channels_last: NHWC weights and inputs.
        fold_bn: fold every Conv -> BatchNorm2d pair (services.inference.folding.fold_conv_bn).
        cuda_graphs: capture one CUDA graph per bucket (only ever True on CUDA, with buckets).
        compile_mode: torch.compile's mode (kind "compile" only, else "").
        cache_key: the compile/TensorRT cache key (hashes the model and every option that changes
            the compiled code), or "" where nothing is compiled.
        cache_path: where the compiled artifacts are kept; None = not kept.
        requested: the backend name as asked for ("auto", "cpu", ...).
        reason: why `requested` became `kind` (one phrase, for the log line).
        graph_warmup_iters: eager iterations before each CUDA graph capture.
    """

    kind: str
    device: torch.device
    precision: str
    buckets: tuple[int, ...] = ()
    channels_last: bool = False
    fold_bn: bool = False
    cuda_graphs: bool = False
    compile_mode: str = ""
    cache_key: str = ""
    cache_path: Path | None = None
    requested: str = ""
    reason: str = ""
    graph_warmup_iters: int = 3

    @property
    def name(self) -> str:
        """What the stage reports (ModelInfo.backend, lipline_backend_info): "cpu" for eager on the CPU."""
        return "cpu" if self.kind == "torch" and self.device.type == "cpu" else self.kind

    @property
    def dtype(self) -> torch.dtype:
        return PRECISIONS[self.precision]

    def bucket_for(self, n: int) -> int:
        """The padded batch size for n rows (`bucket_for` over this spec's buckets)."""
        return bucket_for(self.buckets, n)

    def chunk_rows(self, n: int) -> int:
        """Rows per model call for a batch of n: the largest bucket (bigger batches are split), else n."""
        return self.buckets[-1] if self.buckets else max(n, 1)

    @property
    def warmup_batches(self) -> tuple[int, ...]:
        """The batch sizes every stage warms up with, largest first: the buckets, else one row."""
        return tuple(sorted(self.buckets, reverse=True)) or (1,)

    def describe(self) -> str:
        """e.g. `torch[fp16 channels_last bn-folded cuda-graphs buckets=8,16,32] on cuda`."""
        opts = [self.precision]
        if self.channels_last:
            opts.append("channels_last")
        if self.fold_bn:
            opts.append("bn-folded")
        if self.cuda_graphs:
            opts.append("cuda-graphs")
        if self.buckets:
            opts.append("buckets=" + ",".join(map(str, self.buckets)))
        if self.compile_mode:
            opts.append(f"mode={self.compile_mode}")
        return f"{self.name}[{' '.join(opts)}] on {self.device}"

    @property
    def decision(self) -> str:
        """The one log line: `backend <requested> -> <describe()> (<reason>)`."""
        return f"backend {self.requested or self.kind} -> {self.describe()} ({self.reason or 'as requested'})"


def auto_kind(device: torch.device, *, warm_compile_cache: bool) -> str:
    """What `auto` runs: `compile` where its artifacts are already cached (the fastest backend, at a
    warm start of seconds), else `torch` fp16 + CUDA graphs on CUDA (a cold compile takes minutes,
    which a pod must not spend by surprise), `cpu` elsewhere (docs/performance.md has the numbers)."""
    if device.type != "cuda":
        return "cpu"
    if warm_compile_cache and importlib.util.find_spec("triton") is not None:
        return "compile"
    return "torch"


def _kind_spec(
    kind: str,
    device: torch.device,
    model: nn.Module | None,
    *,
    precision: str | None,
    buckets: tuple[int, ...] | None,
    max_batch: int | None,
    channels_last: bool | None,
    fold_bn: bool | None,
    cuda_graphs: bool | None,
    cache_dir: str | os.PathLike | None,
    compile_mode: str,
    graph_warmup_iters: int,
) -> tuple[BackendSpec, list[str]]:
    """The spec of one concrete kind ("cpu", "torch", "compile", "tensorrt") with its defaults filled in,
    and the notes (options the kind overrides) for the log line."""
    notes: list[str] = []
    cuda = device.type == "cuda"
    if kind == "cpu":
        if cuda:
            notes.append(f"'cpu' runs on the CPU, not {device}")
        device, cuda, kind = torch.device("cpu"), False, "torch"
        precision = precision or "fp32"
    if kind == "tensorrt":
        if importlib.util.find_spec("tensorrt") is None:
            raise RuntimeError(
                "tensorrt backend needs the tensorrt package (pip install tensorrt, or use an NVIDIA TensorRT container); use --backend torch or auto instead"
            )
        if not cuda:
            raise RuntimeError("the tensorrt backend needs a CUDA device")
        # TensorRT holds the weights in its own layout; the export source is the folded fp32 model.
        channels_last, fold_bn, cuda_graphs = False, True, False
    if kind == "compile" and cuda:
        fold_bn = True if fold_bn is None else fold_bn  # folded BN gives Inductor plain convolutions to fuse
        if cuda_graphs is None:
            cuda_graphs = compile_mode_allows_graphs(compile_mode)
    if kind == "compile" and cuda_graphs and not compile_mode_allows_graphs(compile_mode):
        notes.append(f"cuda_graphs off: mode {compile_mode} brings Inductor's own")
        cuda_graphs = False
    precision = precision or ("fp16" if cuda else "fp32")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {sorted(PRECISIONS)}")
    channels_last = cuda if channels_last is None else bool(channels_last)
    if cuda_graphs and not cuda:
        notes.append("cuda_graphs ignored off CUDA")
        cuda_graphs = False
    needs_buckets = kind in ("compile", "tensorrt") or bool(cuda_graphs)
    if buckets is None or (not buckets and needs_buckets):
        buckets = default_buckets(max_batch) if needs_buckets else ()
    spec = BackendSpec(
        kind,
        device,
        precision,
        buckets,
        channels_last,
        bool(fold_bn),
        bool(cuda_graphs),
        compile_mode if kind == "compile" else "",
        graph_warmup_iters=graph_warmup_iters,
    )
    if kind in ("compile", "tensorrt") and model is not None:
        # Keyed on the module as given (before folding or casting) with every option that changes the
        # compiled code, so `auto` can ask "is there a warm cache?" without building anything.
        if kind == "compile":
            extra = f"mode={compile_mode} channels_last={channels_last} fold_bn={bool(fold_bn)}"
            key = compile_cache_key(model, device, precision, buckets, extra=extra)
            path = Path(cache_dir) / f"{key}.bin" if cache_dir else None
        else:
            key = compile_cache_key(
                model, device, precision, buckets, extra=f"tensorrt {_tensorrt_version()} fold_bn=True"
            )
            path = Path(cache_dir) / f"trt-{key}.engine" if cache_dir else None
        spec = dataclasses.replace(spec, cache_key=key, cache_path=path)
    return spec, notes


def resolve_backend_spec(
    backend: str = "auto",
    device: torch.device | str = "cpu",
    *,
    model: nn.Module | None = None,
    precision: str | None = None,
    max_batch: int | None = None,
    batch_buckets: Sequence[int] | None = None,
    channels_last: bool | None = None,
    fold_bn: bool | None = None,
    cuda_graphs: bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    compile_mode: str = DEFAULT_COMPILE_MODE,
    allow_compile: bool = True,
    graph_warmup_iters: int = 3,
    log: bool = True,
) -> BackendSpec:
    """Decide how a model runs, once, from a stage's settings; logs the decision in one line.

    Args:
        backend: "auto", "cpu", "torch", "compile" or "tensorrt".
        device: where the stage runs (`services.inference.device.resolve_device`).
        model: the fp32 model as loaded (hashed into the compile cache key; not modified). Needed for
            "compile"/"tensorrt" keys and for `auto` to look for a warm compile cache.
        precision: "fp32", "fp16", "bf16"; None = fp16 on CUDA, fp32 on the CPU.
        max_batch: the stage's largest batch: default buckets end there (`default_buckets`).
        batch_buckets: explicit buckets; None or () = the default where graphs or compilation need
            buckets, else none.
        channels_last, fold_bn, cuda_graphs: None = the kind's default (see the module docstring).
        cache_dir: where compile/TensorRT artifacts are kept; None = not kept.
        compile_mode: torch.compile's mode for "compile".
        allow_compile: False makes `auto` skip a warm compile cache (the fallback after a compile
            failed at start-up: `services.inference.stage.start_backend`).
        log: log the decision (`BackendSpec.decision`) at INFO.

    Raises:
        ValueError: an unknown backend or precision, or bad buckets.
    """
    if backend not in BACKEND_KINDS:
        raise ValueError(f"backend {backend!r} is not one of {list(BACKEND_KINDS)}")
    device = torch.device(device)
    buckets = normalise_buckets(batch_buckets) if batch_buckets else None
    options: dict[str, Any] = dict(
        precision=precision,
        buckets=buckets,
        max_batch=max_batch,
        channels_last=channels_last,
        cache_dir=cache_dir,
        compile_mode=compile_mode,
        graph_warmup_iters=graph_warmup_iters,
    )
    reason = ""
    if backend != "auto":
        spec, notes = _kind_spec(backend, device, model, fold_bn=fold_bn, cuda_graphs=cuda_graphs, **options)
    elif device.type != "cuda":
        spec, notes = _kind_spec("cpu", device, model, fold_bn=fold_bn, cuda_graphs=cuda_graphs, **options)
        reason = "no CUDA device"
    else:
        fold = True if fold_bn is None else fold_bn
        compiled = None
        if model is not None and cache_dir is not None and allow_compile:
            compiled, notes = _kind_spec("compile", device, model, fold_bn=fold, cuda_graphs=cuda_graphs, **options)
        warm = compiled is not None and compiled.cache_path is not None and compiled.cache_path.is_file()
        if warm and compiled is not None and auto_kind(device, warm_compile_cache=True) == "compile":
            spec, reason = compiled, f"compile cache warm at {compiled.cache_path}"
        else:
            spec, notes = _kind_spec(
                "torch",
                device,
                model,
                fold_bn=fold,
                cuda_graphs=True if cuda_graphs is None else cuda_graphs,
                **options,
            )
            if not allow_compile:
                reason = "compile not allowed (fallback)"
            elif compiled is None:
                reason = "no compile cache dir"
            elif warm:
                reason = "compile cache warm but triton missing"
            else:
                reason = f"no warm compile cache at {compiled.cache_path}"
    spec = dataclasses.replace(spec, requested=backend, reason="; ".join(filter(None, [reason, *notes])))
    if log:
        _LOGGER.info(
            spec.decision,
            extra={
                "backend": spec.name,
                "requested": backend,
                "device": str(spec.device),
                "precision": spec.precision,
                "buckets": list(spec.buckets),
            },
        )
    return spec
