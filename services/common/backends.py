"""How a stage runs its torch model: the Backend interface (DESIGN.md section 4).

Every backend has `name`, `precision`, `device`, `warmup(example_inputs_fn)` and
`__call__(*inputs) -> float32 CPU tensor`. Kinds (`make_backend`):

* `cpu`      - eager fp32 on the CPU (today's default off-GPU).
* `torch`    - eager on CUDA; options: precision fp32/fp16/bf16, channels_last, fold_bn (BatchNorm
               folded into the convs), cuda_graphs (one CUDA graph per batch bucket).
* `compile`  - `torch.compile` (max-autotune by default) over the same options, with the compiler's
               cache artifacts persisted per model/torch/GPU/precision/buckets key.
* `tensorrt` - an ONNX -> TensorRT engine (only where the `tensorrt` package is importable).
* `auto`     - CUDA: `compile` when its cache artifacts for this model and options are on disk
               (a warm start), else `torch` with fp16 + fold_bn + CUDA graphs; CPU: `cpu`.

Batch buckets: with `batch_buckets=(8, 32, 128)` a batch of n is padded with zero rows up to the
smallest bucket >= n (batches larger than the largest bucket are split into chunks), so the model
only ever sees a few static shapes: a precondition for CUDA graphs and static-shape compilation,
and what keeps cuDNN's benchmark cache small. The padded rows' outputs are dropped. This assumes a
per-sample model (no batch-coupled ops; eval-mode BatchNorm is per sample).

Everything runs on the CPU too (cuda_graphs is ignored there with a debug log), so the unit tests
exercise the same code paths as the GPU. The choice is logged and exported as `lipline_backend_info`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import logging
import math
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from services.common.folding import fold_conv_bn

__all__ = [
    "BACKEND_KINDS",
    "DEFAULT_BUCKETS",
    "PRECISIONS",
    "CompiledBackend",
    "TensorRTBackend",
    "TorchBackend",
    "auto_kind",
    "compile_cache_path",
    "compile_mode_allows_graphs",
    "default_buckets",
    "make_backend",
    "numerics_check",
    "reference_output",
    "relative_error",
    "strict_fp32",
]

_LOGGER = logging.getLogger(__name__)

PRECISIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
BACKEND_KINDS = ("auto", "cpu", "torch", "compile", "tensorrt")
# Padding waste is at most 2x between neighbours; the shared graph pool makes extra buckets cheap.
DEFAULT_BUCKETS: tuple[int, ...] = (8, 16, 32, 64, 128, 256)

# example_inputs_fn(batch) -> the model's positional inputs for that batch size (float32, any device).
ExampleInputsFn = Callable[[int], Sequence[torch.Tensor]]


def default_buckets(max_batch: int | None = None) -> tuple[int, ...]:
    """DEFAULT_BUCKETS below `max_batch`, plus `max_batch` itself (so a full batch is never padded)."""
    if not max_batch:
        return DEFAULT_BUCKETS
    return tuple(b for b in DEFAULT_BUCKETS if b < max_batch) + (int(max_batch),)


def _default_precision(device: torch.device, precision: str | None) -> str:
    return precision or ("fp16" if device.type == "cuda" else "fp32")


def _default_channels_last(device: torch.device, channels_last: bool | None) -> bool:
    return device.type == "cuda" if channels_last is None else bool(channels_last)


def _normalise_buckets(buckets: Sequence[int] | None) -> tuple[int, ...]:
    out = tuple(sorted({int(b) for b in (buckets or ())}))
    if any(b <= 0 for b in out):
        raise ValueError(f"batch buckets must be positive, got {list(buckets or ())}")
    return out


class _CudaGraphRunner:
    """One captured forward pass at a fixed input shape: static inputs in, replay, static output out."""

    def __init__(self, fn: Callable[..., torch.Tensor], example: Sequence[torch.Tensor], pool: object,
                 warmup_iters: int) -> None:
        self.static_inputs = [x.clone() for x in example]  # clone keeps the memory format
        # Eager iterations on a side stream first: cuDNN benchmark picks its algorithms and the
        # caching allocator settles before anything is recorded (torch.cuda.graphs docs' recipe).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(1, warmup_iters)):
                fn(*self.static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.static_output = fn(*self.static_inputs)

    def matches(self, inputs: Sequence[torch.Tensor]) -> bool:
        return len(inputs) == len(self.static_inputs) and all(
            x.shape[1:] == s.shape[1:] for x, s in zip(inputs, self.static_inputs)
        )

    def run(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Copy the n rows in (dtype/device conversion included), replay, return the first n output rows.

        Rows n.. of the static inputs keep stale data from earlier calls: their outputs are dropped.
        The returned view is overwritten by the next replay; callers copy it out at once.
        """
        n = inputs[0].shape[0]
        for buf, x in zip(self.static_inputs, inputs):
            buf[:n].copy_(x, non_blocking=True)
        self.graph.replay()
        return self.static_output[:n]


class TorchBackend:
    """Runs an eval-mode module under inference_mode on one device.

    Args:
        module: the model; the backend works on a copy, so the caller's module stays as it was (it is
            the fp32 reference of the start-up numerics check).
        device: where to run.
        precision: "fp32", "fp16" or "bf16"; None = fp16 on CUDA, fp32 on CPU.
        channels_last: NHWC weights and inputs; None = on for CUDA, off for CPU.
        fold_bn: fold every Conv -> BatchNorm2d pair (services.common.folding.fold_conv_bn).
        cuda_graphs: capture one CUDA graph per batch bucket (ignored, with a debug log, off CUDA);
            implies buckets (DEFAULT_BUCKETS when none are given).
        batch_buckets: pad batches to these sizes (see the module docstring); () = no padding.
        graph_warmup_iters: eager iterations before each capture.

    The defaults reproduce the previous behaviour: CPU fp32 eager; CUDA fp16 + channels_last eager
    with cudnn.benchmark.
    """

    kind = "torch"

    def __init__(
        self,
        module: nn.Module,
        device: torch.device | str,
        precision: str | None = None,
        *,
        channels_last: bool | None = None,
        fold_bn: bool = False,
        cuda_graphs: bool = False,
        batch_buckets: Sequence[int] | None = (),
        graph_warmup_iters: int = 3,
    ) -> None:
        device = torch.device(device)
        self.device = device
        self.precision = _default_precision(device, precision)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} is not one of {sorted(PRECISIONS)}")
        self.dtype = PRECISIONS[self.precision]
        self.name = "cpu" if device.type == "cpu" else self.kind
        self.channels_last = _default_channels_last(device, channels_last)
        self.fold_bn = bool(fold_bn)
        self.batch_buckets = _normalise_buckets(batch_buckets)
        if cuda_graphs and device.type != "cuda":
            _LOGGER.debug("cuda_graphs ignored on device %s (CUDA graphs need a CUDA device)", device)
            cuda_graphs = False
        if cuda_graphs and not self.batch_buckets:
            self.batch_buckets = DEFAULT_BUCKETS
            _LOGGER.info("cuda_graphs without batch buckets: using %s", DEFAULT_BUCKETS)
        self.cuda_graphs = bool(cuda_graphs)
        self.graph_warmup_iters = graph_warmup_iters
        module = fold_conv_bn(module) if self.fold_bn else copy.deepcopy(module)  # both copy
        module = module.eval().to(device=device, dtype=self.dtype)
        if self.channels_last:
            module = module.to(memory_format=torch.channels_last)
        if device.type == "cuda":
            # Static shapes (buckets) make this pay off: one algorithm search per shape, at warm-up.
            torch.backends.cudnn.benchmark = True
        self.module = module
        self._graphs: dict[int, _CudaGraphRunner] = {}
        self._graph_pool: object | None = None
        self._graphs_failed = False
        # One replay at a time: the graphs share a memory pool and their static buffers.
        self._lock = threading.Lock()

    # -- what subclasses override -------------------------------------------------------------------

    def _forward(self, *xs: torch.Tensor) -> torch.Tensor:
        """The model call on device tensors already in the backend's dtype/layout."""
        return self.module(*xs)

    # -- helpers ------------------------------------------------------------------------------------

    def describe(self) -> str:
        opts = [self.precision]
        if self.channels_last:
            opts.append("channels_last")
        if self.fold_bn:
            opts.append("bn-folded")
        if self.cuda_graphs:
            opts.append("cuda-graphs")
        if self.batch_buckets:
            opts.append("buckets=" + ",".join(map(str, self.batch_buckets)))
        return f"{self.name}[{' '.join(opts)}] on {self.device}"

    def bucket_for(self, n: int) -> int:
        """The padded batch size for n rows (n itself without buckets; at most the largest bucket)."""
        for b in self.batch_buckets:
            if b >= n:
                return b
        return self.batch_buckets[-1] if self.batch_buckets else n

    def _to_device(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device, dtype=self.dtype, non_blocking=True)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def _pad(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        if x.shape[0] == rows:
            return x
        pad = x.new_zeros((rows - x.shape[0], *x.shape[1:]))
        out = torch.cat((x, pad))
        if self.channels_last and out.dim() == 4:
            out = out.contiguous(memory_format=torch.channels_last)
        return out

    @staticmethod
    def _to_host(y: torch.Tensor) -> torch.Tensor:
        return y.to(torch.float32, memory_format=torch.contiguous_format).cpu()

    def _capture(self, bucket: int, example: Sequence[torch.Tensor]) -> _CudaGraphRunner | None:
        """Capture the graph for `bucket` from example rows (padded); None (eager from now on) on failure."""
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        padded = [self._pad(self._to_device(x), bucket) for x in example]
        t0 = time.perf_counter()
        try:
            runner = _CudaGraphRunner(self._forward, padded, self._graph_pool, self.graph_warmup_iters)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be captured still runs eagerly
            _LOGGER.warning("CUDA graph capture failed at batch %d (%s); running eagerly", bucket, exc)
            self._graphs_failed = True
            return None
        took = time.perf_counter() - t0
        _LOGGER.info("captured CUDA graph for batch %d in %.2fs", bucket, took, extra={"batch": bucket, "seconds": round(took, 3)})
        self._graphs[bucket] = runner
        return runner

    def _run_chunk(self, chunk: Sequence[torch.Tensor]) -> torch.Tensor:
        """At most max-bucket rows -> the model's output rows for exactly those rows, on the device.

        With CUDA graphs the result is a view of the graph's static output: valid until the next call.
        """
        n = chunk[0].shape[0]
        bucket = self.bucket_for(n)
        if self.cuda_graphs and not self._graphs_failed:
            runner = self._graphs.get(bucket)
            if runner is None:
                runner = self._capture(bucket, chunk)
            if runner is not None and runner.matches(chunk):
                return runner.run(chunk)
        xs = [self._pad(self._to_device(x), bucket) for x in chunk]
        return self._forward(*xs)[:n]

    def _chunks(self, inputs: Sequence[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
        n = inputs[0].shape[0]
        step = self.batch_buckets[-1] if self.batch_buckets else max(n, 1)
        for i in range(0, n, step):
            yield [x[i:i + step] for x in inputs]

    # -- public -------------------------------------------------------------------------------------

    @torch.inference_mode()
    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Inputs float32 on any device (batch first) -> output float32 on the CPU."""
        with self._lock:
            outs = [self._to_host(self._run_chunk(chunk)) for chunk in self._chunks(inputs)]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    @torch.inference_mode()
    def forward_device(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Like `__call__` but the output stays on the device in the backend's dtype (no copy to host).

        For benchmarks and device-side pipelines. With CUDA graphs and a batch of at most the
        largest bucket, the result aliases the graph's output buffer: consume it before the next call.
        """
        with self._lock:
            outs = [self._run_chunk(chunk) for chunk in self._chunks(inputs)]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    @torch.inference_mode()
    def warmup(self, example_inputs_fn: ExampleInputsFn, batches: Sequence[int] | None = None) -> dict[int, float]:
        """Run (and with cuda_graphs, capture) every bucket once, largest first; returns seconds per batch.

        Args:
            example_inputs_fn: batch size -> model inputs of that batch size.
            batches: sizes to warm; default the buckets, else (1,).
        """
        sizes = sorted(set(batches or self.batch_buckets or (1,)), reverse=True)
        took: dict[int, float] = {}
        for b in sizes:
            t0 = time.perf_counter()
            inputs = list(example_inputs_fn(b))
            self(*inputs)  # captures the bucket's graph on first use
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            took[b] = time.perf_counter() - t0
        _LOGGER.info("backend warm: %s in %.1fs", self.describe(), sum(took.values()),
                     extra={"backend": self.describe(), "seconds": {str(k): round(v, 3) for k, v in took.items()}})
        return took


# ---------------------------------------------------------------------------------------------------
# torch.compile, with the compiler's cache artifacts kept on disk
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


def compile_cache_key(module: nn.Module, device: torch.device, precision: str, buckets: Sequence[int],
                      extra: str = "") -> str:
    """sha256 of (model state, torch version, GPU name/capability, precision, buckets, extra)."""
    parts = [_state_hash(module), torch.__version__, _device_tag(device), precision,
             ",".join(map(str, buckets)), extra]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def compile_cache_path(module: nn.Module, device: torch.device | str, cache_dir: str | os.PathLike, *,
                       precision: str | None = None, batch_buckets: Sequence[int] | None = None,
                       channels_last: bool | None = None, fold_bn: bool = False,
                       mode: str = "max-autotune-no-cudagraphs") -> Path:
    """Where `CompiledBackend` keeps (and looks for) the cache artifacts of `module` with these options.

    The key hashes the module as given (before folding or casting) with every option that changes
    the compiled code, so `auto` can ask "is there a warm cache?" without building anything.
    """
    device = torch.device(device)
    buckets = _normalise_buckets(batch_buckets) or DEFAULT_BUCKETS
    extra = f"mode={mode} channels_last={_default_channels_last(device, channels_last)} fold_bn={bool(fold_bn)}"
    key = compile_cache_key(module, device, _default_precision(device, precision), buckets, extra=extra)
    return Path(cache_dir) / f"{key}.bin"


def compile_mode_allows_graphs(mode: str) -> bool:
    """True for torch.compile modes without Inductor's own CUDA graphs (which must not be nested in ours)."""
    return mode in ("default", "max-autotune-no-cudagraphs")


class CompiledBackend(TorchBackend):
    """`TorchBackend` whose forward is `torch.compile(module, mode=...)` with static (bucketed) shapes.

    mode "max-autotune-no-cudagraphs" (default) benchmarks Triton/cuBLAS/cuDNN choices per shape;
    "reduce-overhead"/"max-autotune" also let Inductor use its own CUDA graphs (our cuda_graphs
    option is then ignored: the two must not nest). With a mode without Inductor graphs, our
    `cuda_graphs` option captures the compiled forward per bucket like the eager backend does: the
    compiled code is plain kernel launches, and a graph removes their per-launch host cost, which
    matters for models of many small layers (SRVGG: 66 kernels per batch). The compiler's cache artifacts (Inductor/AOT
    caches, autotuning results) are loaded from `<cache_dir>/<key>.bin` before the first compile and
    saved there after `warmup`, so a restarted pod with the same model/torch/GPU skips most of the
    compile. Compilation happens lazily on the first call per bucket: call `warmup` at start-up.
    """

    kind = "compile"

    def __init__(self, module: nn.Module, device: torch.device | str, precision: str | None = None, *,
                 mode: str = "max-autotune-no-cudagraphs", cache_dir: str | os.PathLike | None = None,
                 cache_path: Path | None = None, **options: object) -> None:
        if options.get("cuda_graphs") and not compile_mode_allows_graphs(mode):
            _LOGGER.info("compile backend: cuda_graphs option ignored (mode %r brings Inductor's own graphs)", mode)
            options["cuda_graphs"] = False
        # Keyed on the module as given: TorchBackend folds, casts and moves it next. `cache_path`: the
        # same, already computed by the caller (make_backend's `auto`), to hash the weights only once.
        path = cache_path or compile_cache_path(
            module, device, cache_dir or ".", precision=precision, mode=mode,
            batch_buckets=options.get("batch_buckets"), channels_last=options.get("channels_last"),  # type: ignore[arg-type]
            fold_bn=bool(options.get("fold_bn")),
        )
        super().__init__(module, device, precision, **options)  # type: ignore[arg-type]
        self.name = self.kind
        self.mode = mode
        if not self.batch_buckets:
            self.batch_buckets = DEFAULT_BUCKETS
        self.cache_key = path.stem
        self.cache_path = path if cache_dir or cache_path else None
        self.cache_loaded = self._load_cache()
        self.compile_seconds: float | None = None
        self._compiled = torch.compile(self.module, mode=mode, dynamic=False)

    def _forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self._compiled(*xs)

    def _load_cache(self) -> bool:
        if self.cache_path is None or not self.cache_path.is_file():
            return False
        try:
            info = torch.compiler.load_cache_artifacts(self.cache_path.read_bytes())
        except Exception as exc:  # noqa: BLE001 - a stale or foreign cache only costs a full compile
            _LOGGER.warning("could not load compile cache %s: %s", self.cache_path, exc)
            return False
        if info is None:  # torch logs why (corrupt, or from another torch build) and returns None
            _LOGGER.warning("compile cache %s was not usable; compiling from scratch", self.cache_path)
            return False
        _LOGGER.info("loaded compile cache", extra={"path": str(self.cache_path), "info": str(info)[:200]})
        return True

    def save_cache(self) -> Path | None:
        """Write the compiler's cache artifacts to `<cache_dir>/<key>.bin` (atomically); None if nothing."""
        if self.cache_path is None:
            return None
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            return None
        data, _info = saved
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(self.cache_path)
        _LOGGER.info("saved compile cache", extra={"path": str(self.cache_path), "bytes": len(data)})
        return self.cache_path

    def warmup(self, example_inputs_fn: ExampleInputsFn, batches: Sequence[int] | None = None) -> dict[int, float]:
        t0 = time.perf_counter()
        took = super().warmup(example_inputs_fn, batches)
        self.compile_seconds = time.perf_counter() - t0
        self.save_cache()
        return took


# ---------------------------------------------------------------------------------------------------
# TensorRT (needs the tensorrt package; NOT exercised in CI: written against the TensorRT 10 Python
# API documentation - Builder/OnnxParser/IOptimizationProfile/execute_async_v3 - and to be verified
# on the GPU before it is offered as a default)
# ---------------------------------------------------------------------------------------------------


def export_onnx(module: nn.Module, example: Sequence[torch.Tensor], path: str | os.PathLike,
                opset: int = 17, *, input_names: Sequence[str] | None = None,
                output_names: Sequence[str] = ("output",),
                dynamic_axes: dict[str, dict[int, str]] | None = None) -> list[str]:
    """Export `module` (fp32) to ONNX with a dynamic batch axis on every input and the output.

    Uses the TorchScript exporter (`dynamo=False`): it needs only the `onnx` package, not onnxscript.
    Returns the input names (default "input0", "input1", ...; the output is "output").
    `dynamic_axes` (name -> {axis: label}) replaces the default batch-only axes when given.
    """
    import warnings

    names = list(input_names) if input_names is not None else [f"input{i}" for i in range(len(example))]
    if len(names) != len(example):
        raise ValueError(f"{len(names)} input names for {len(example)} example inputs")
    axes = dynamic_axes if dynamic_axes is not None else {name: {0: "batch"} for name in [*names, *output_names]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "legacy TorchScript-based exporter"
        torch.onnx.export(module, tuple(example), str(path), input_names=names, output_names=list(output_names),
                          dynamic_axes=axes, opset_version=opset, dynamo=False)
    return names


class TensorRTBackend(TorchBackend):
    """ONNX -> TensorRT engine (FP16 builder flag), one optimisation profile spanning the buckets.

    The engine is built (or read from `<cache_dir>/trt-<key>.engine`) in `warmup`, which needs
    example inputs for the export. Inference binds device pointers and calls `execute_async_v3` on
    the current torch stream; inputs/outputs stay float32 at the engine boundary.
    """

    kind = "tensorrt"

    def __init__(self, module: nn.Module, device: torch.device | str, precision: str | None = None, *,
                 cache_dir: str | os.PathLike | None = None, batch_buckets: Sequence[int] | None = None,
                 **_ignored: object) -> None:
        import tensorrt as trt  # noqa: F401 - fail here, not in warmup, when it is missing

        device = torch.device(device)
        if device.type != "cuda":
            raise RuntimeError("the tensorrt backend needs a CUDA device")
        # The fp32 module on the CPU is only the export source; TensorRT holds the weights.
        super().__init__(module, "cpu", "fp32", channels_last=False, fold_bn=True, batch_buckets=batch_buckets)
        self.device = device
        self.precision = precision or "fp16"
        self.name = self.kind
        if not self.batch_buckets:
            self.batch_buckets = DEFAULT_BUCKETS
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self._context = None
        self._engine = None
        self._input_names: list[str] = []

    def _build(self, example: Sequence[torch.Tensor]) -> None:
        import tensorrt as trt

        key = compile_cache_key(self.module, self.device, self.precision, self.batch_buckets,
                                extra=f"tensorrt {trt.__version__}")
        cache = self.cache_dir / f"trt-{key}.engine" if self.cache_dir else None
        logger = trt.Logger(trt.Logger.WARNING)
        names = [f"input{i}" for i in range(len(example))]
        if cache is not None and cache.is_file():
            blob = cache.read_bytes()
        else:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                onnx_path = Path(tmp) / "model.onnx"
                names = export_onnx(self.module, [x[:1].float().cpu() for x in example], onnx_path)
                builder = trt.Builder(logger)
                network = builder.create_network(0)  # explicit batch is the only mode in TRT 10
                parser = trt.OnnxParser(network, logger)
                if not parser.parse_from_file(str(onnx_path)):
                    errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
                    raise RuntimeError(f"TensorRT could not parse the ONNX export: {errors}")
            config = builder.create_builder_config()
            if self.precision == "fp16":
                config.set_flag(trt.BuilderFlag.FP16)
            elif self.precision == "bf16":
                config.set_flag(trt.BuilderFlag.BF16)
            profile = builder.create_optimization_profile()
            lo, hi = self.batch_buckets[0], self.batch_buckets[-1]
            opt = self.batch_buckets[len(self.batch_buckets) // 2]
            for name, x in zip(names, example):
                rest = tuple(x.shape[1:])
                profile.set_shape(name, (1, *rest), (opt, *rest), (hi, *rest))
            config.add_optimization_profile(profile)
            _LOGGER.info("building TensorRT engine (minutes)", extra={"batches": [lo, opt, hi]})
            serialized = builder.build_serialized_network(network, config)
            if serialized is None:
                raise RuntimeError("TensorRT engine build failed (see the TensorRT log above)")
            blob = bytes(serialized)
            if cache is not None:
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_bytes(blob)
        runtime = trt.Runtime(logger)
        self._engine = runtime.deserialize_cuda_engine(blob)
        self._context = self._engine.create_execution_context()
        self._input_names = names

    def _run_chunk(self, chunk: Sequence[torch.Tensor]) -> torch.Tensor:
        if self._context is None:
            raise RuntimeError("TensorRTBackend: call warmup(example_inputs_fn) first (it builds the engine)")
        ctx = self._context
        xs = [x.to(self.device, torch.float32).contiguous() for x in chunk]
        for name, x in zip(self._input_names, xs):
            ctx.set_input_shape(name, tuple(x.shape))
            ctx.set_tensor_address(name, x.data_ptr())
        out = torch.empty(tuple(ctx.get_tensor_shape("output")), device=self.device, dtype=torch.float32)
        ctx.set_tensor_address("output", out.data_ptr())
        if not ctx.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        return out

    @torch.inference_mode()
    def warmup(self, example_inputs_fn: ExampleInputsFn, batches: Sequence[int] | None = None) -> dict[int, float]:
        if self._context is None:
            with torch.inference_mode(False):
                self._build(list(example_inputs_fn(self.batch_buckets[0])))
        return super().warmup(example_inputs_fn, batches)


# ---------------------------------------------------------------------------------------------------
# Numerics and the factory
# ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def strict_fp32() -> Iterator[None]:
    """No TF32 in cuDNN convolutions / cuBLAS matmuls inside the block (true fp32 references on GPU)."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision"):  # torch >= 2.9 API
        saved = conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision
        conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision = "ieee", "ieee"
        try:
            yield
        finally:
            conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision = saved
        return
    saved_legacy = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved_legacy


def relative_error(output: torch.Tensor, reference: torch.Tensor) -> float:
    """||output - reference|| / ||reference|| (Frobenius, in float64)."""
    a = output.detach().to("cpu", torch.float64)
    b = reference.detach().to("cpu", torch.float64)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {tuple(a.shape)} vs reference {tuple(b.shape)}")
    denom = float(torch.linalg.vector_norm(b))
    diff = float(torch.linalg.vector_norm(a - b))
    return diff / denom if denom > 0 else (0.0 if diff == 0 else math.inf)


@torch.inference_mode()
def reference_output(reference: nn.Module, inputs: Sequence[torch.Tensor], device: torch.device | str) -> torch.Tensor:
    """The fp32 (no TF32) output of an eval-mode copy of `reference` on `device`, as a CPU tensor."""
    model = copy.deepcopy(reference).eval().to(device=device, dtype=torch.float32)
    with strict_fp32():
        out = model(*[x.to(device, torch.float32) for x in inputs])
    return out.float().cpu()


def numerics_check(backend: TorchBackend, reference: nn.Module, inputs: Sequence[torch.Tensor],
                   bound: float = 1e-2) -> float:
    """Relative error of `backend` against the fp32 `reference` module on the same inputs.

    Raises RuntimeError naming the backend and both numbers when the error exceeds `bound` (or is
    not finite). `reference` is not modified (an fp32 copy runs on the backend's device).
    """
    ref = reference_output(reference, inputs, backend.device)
    out = backend(*inputs)
    err = relative_error(out, ref)
    if not math.isfinite(err) or err > bound:
        desc = backend.describe() if hasattr(backend, "describe") else getattr(backend, "name", "?")
        raise RuntimeError(
            f"numerics check failed for {desc}: relative error {err:.3e} exceeds bound {bound:.1e} "
            f"(||out - ref|| / ||ref|| over {ref.numel()} values)"
        )
    return err


def auto_kind(device: torch.device, *, warm_compile_cache: bool) -> str:
    """What `auto` runs: `compile` where its artifacts are already cached (the fastest backend, at a
    warm start of seconds), else `torch` fp16 + CUDA graphs on CUDA (a cold compile takes minutes,
    which a pod must not spend by surprise), `cpu` elsewhere. Measured on an H200: SRVGG 13,443 vs
    6,424 crops/s, Wav2Lip 35,415 vs 22,336 frames/s (docs/performance.md)."""
    if device.type != "cuda":
        return "cpu"
    if warm_compile_cache and importlib.util.find_spec("triton") is not None:
        return "compile"
    return "torch"


def make_backend(
    kind: str,
    module: nn.Module,
    device: torch.device | str,
    *,
    precision: str | None = None,
    batch_buckets: Sequence[int] | None = None,
    max_batch: int | None = None,
    channels_last: bool | None = None,
    fold_bn: bool | None = None,
    cuda_graphs: bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    compile_mode: str = "max-autotune-no-cudagraphs",
    allow_compile: bool = True,
) -> TorchBackend:
    """Build the backend `kind` ("auto", "cpu", "torch", "compile", "tensorrt") for `module`.

    `allow_compile=False` makes `auto` skip a warm compile cache (the fallback after a compile
    failed at start-up: `services.common.device.start_backend`).

    Options left as None take the kind's defaults: `torch` = fp16 + channels_last eager on CUDA
    (fp32 on CPU); `compile` on CUDA = fold_bn, plus our cuda_graphs when the mode has none of
    Inductor's own; `auto` on CUDA = `compile` if `cache_dir` holds its artifacts for exactly these
    options (`auto_kind`), else `torch` + fold_bn + cuda_graphs. Buckets default (where graphs
    or compilation need them) to `default_buckets(max_batch)`. Call `.warmup(...)` afterwards.
    """
    device = torch.device(device)
    known_cache: Path | None = None  # the compile cache file `auto` looked for
    if kind not in BACKEND_KINDS:
        raise ValueError(f"backend {kind!r} is not one of {list(BACKEND_KINDS)}")
    if kind == "auto":
        if device.type == "cuda":
            fold_bn = True if fold_bn is None else fold_bn
            if cache_dir is not None:
                known_cache = compile_cache_path(
                    module, device, cache_dir, precision=precision, channels_last=channels_last, fold_bn=fold_bn,
                    mode=compile_mode,
                    batch_buckets=batch_buckets if batch_buckets is not None else default_buckets(max_batch),
                )
            warm = allow_compile and known_cache is not None and known_cache.is_file()
            kind = auto_kind(device, warm_compile_cache=warm)
            if not warm:
                known_cache = None
            if kind == "torch":
                cuda_graphs = True if cuda_graphs is None else cuda_graphs
        else:
            kind = "cpu"
        _LOGGER.info("backend auto -> %s", kind, extra={"backend": kind, "device": str(device)})
    if kind == "compile" and device.type == "cuda":
        fold_bn = True if fold_bn is None else fold_bn  # folded BN gives Inductor plain convolutions to fuse
        if cuda_graphs is None:
            cuda_graphs = compile_mode_allows_graphs(compile_mode)
    buckets = batch_buckets
    if buckets is None and (kind in ("compile", "tensorrt") or (cuda_graphs and device.type == "cuda")):
        buckets = default_buckets(max_batch)
    common = dict(channels_last=channels_last, fold_bn=bool(fold_bn), batch_buckets=buckets or ())
    if kind == "cpu":
        if device.type != "cpu":
            _LOGGER.info("backend 'cpu' requested: running on the CPU, not %s", device)
        return TorchBackend(module, torch.device("cpu"), precision or "fp32", **common)
    if kind == "torch":
        return TorchBackend(module, device, precision, cuda_graphs=bool(cuda_graphs), **common)
    if kind == "compile":
        return CompiledBackend(module, device, precision, mode=compile_mode, cache_dir=cache_dir,
                               cache_path=known_cache, cuda_graphs=bool(cuda_graphs), **common)
    # tensorrt
    if importlib.util.find_spec("tensorrt") is None:
        raise RuntimeError(
            "tensorrt backend needs the tensorrt package (pip install tensorrt, or use an NVIDIA TensorRT container); "
            "use --backend torch or auto instead"
        )
    return TensorRTBackend(module, device, precision, cache_dir=cache_dir, batch_buckets=buckets)
