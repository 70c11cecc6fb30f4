"""Eager torch backends: a spec-driven base (buckets, chunks, warm-up) and `TorchBackend` (CUDA graphs).

Everything runs on the CPU too (a spec never has cuda_graphs off CUDA), so the unit tests exercise
the same padding and chunking code the GPU runs.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from services.inference.backends.protocol import ExampleInputsFn
from services.inference.backends.spec import BackendSpec
from services.inference.folding import fold_conv_bn

if TYPE_CHECKING:  # what torch.cuda.graph_pool_handle() returns (a NewType of torch's stubs)
    from torch.cuda import _POOL_HANDLE

__all__ = ["SpecBackend", "TorchBackend", "prepare_module"]

_LOGGER = logging.getLogger("services.inference.backends")


class _CudaGraphRunner:
    """One captured forward pass at a fixed input shape: static inputs in, replay, static output out."""

    def __init__(
        self, fn: Callable[..., torch.Tensor], example: Sequence[torch.Tensor], pool: _POOL_HANDLE, warmup_iters: int
    ) -> None:
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


def prepare_module(module: nn.Module, spec: BackendSpec) -> nn.Module:
    """An eval-mode copy of `module` as the spec runs it: folded, cast, moved, channels_last.

    The caller's module stays as it was (it is the fp32 reference of the start-up numerics check).
    """
    module = fold_conv_bn(module) if spec.fold_bn else copy.deepcopy(module)  # both copy
    module = module.eval().to(device=spec.device, dtype=spec.dtype)
    if spec.channels_last:
        module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs omit memory_format
    return module


class SpecBackend:
    """What every backend shares, all read from its `BackendSpec`: the reported fields, bucket
    padding, chunking above the largest bucket, `__call__`/`forward_device` and `warmup`.

    A subclass supplies `_run_chunk` (at most the largest bucket's rows -> those rows' outputs on
    the device) and may extend `warmup` (where compilation or an engine build happens).
    """

    def __init__(self, spec: BackendSpec) -> None:
        self.spec = spec
        # One model call at a time: CUDA graphs and engines share static buffers.
        self._lock = threading.Lock()

    # -- the spec's fields, under the names the stages and metrics use ------------------------------

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def device(self) -> torch.device:
        return self.spec.device

    @property
    def precision(self) -> str:
        return self.spec.precision

    @property
    def dtype(self) -> torch.dtype:
        return self.spec.dtype

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        return self.spec.buckets

    @property
    def channels_last(self) -> bool:
        return self.spec.channels_last

    @property
    def fold_bn(self) -> bool:
        return self.spec.fold_bn

    def describe(self) -> str:
        return self.spec.describe()

    def bucket_for(self, n: int) -> int:
        """The padded batch size for n rows (the spec's bucket rule)."""
        return self.spec.bucket_for(n)

    # -- what subclasses supply -----------------------------------------------------------------------

    def _run_chunk(self, chunk: Sequence[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------------------

    def _chunks(self, inputs: Sequence[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
        n = inputs[0].shape[0]
        step = self.spec.chunk_rows(n)
        for i in range(0, n, step):
            yield [x[i : i + step] for x in inputs]

    @staticmethod
    def _to_host(y: torch.Tensor) -> torch.Tensor:
        return y.to(torch.float32, memory_format=torch.contiguous_format).cpu()

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
    def warmup(self, example_inputs_fn: ExampleInputsFn) -> dict[int, float]:
        """Run (and with cuda_graphs, capture) each of `spec.warmup_batches` once; seconds per batch."""
        took: dict[int, float] = {}
        for b in self.spec.warmup_batches:
            t0 = time.perf_counter()
            self(*list(example_inputs_fn(b)))  # captures the bucket's graph on first use
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            took[b] = time.perf_counter() - t0
        _LOGGER.info(
            "backend warm: %s in %.1fs",
            self.describe(),
            sum(took.values()),
            extra={"backend": self.describe(), "seconds": {str(k): round(v, 3) for k, v in took.items()}},
        )
        return took


class TorchBackend(SpecBackend):
    """Runs an eval-mode copy of a module under inference_mode, as its spec says.

    Args:
        module: the model; the backend works on a copy (`prepare_module`).
        spec: from `resolve_backend_spec`: device, precision, channels_last, fold_bn, buckets and
            cuda_graphs (one CUDA graph per bucket, captured on first use: call `warmup`).
    """

    def __init__(self, module: nn.Module, spec: BackendSpec) -> None:
        super().__init__(spec)
        if spec.device.type == "cuda":
            # Static shapes (buckets) make this pay off: one algorithm search per shape, at warm-up.
            torch.backends.cudnn.benchmark = True
        self.module = prepare_module(module, spec)
        self.cuda_graphs = spec.cuda_graphs
        self._graphs: dict[int, _CudaGraphRunner] = {}
        self._graph_pool: _POOL_HANDLE | None = None
        self._graphs_failed = False

    def _forward(self, *xs: torch.Tensor) -> torch.Tensor:
        """The model call on device tensors already in the backend's dtype/layout."""
        return self.module(*xs)

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

    def _capture(self, bucket: int, example: Sequence[torch.Tensor]) -> _CudaGraphRunner | None:
        """Capture the graph for `bucket` from example rows (padded); None (eager from now on) on failure."""
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        padded = [self._pad(self._to_device(x), bucket) for x in example]
        t0 = time.perf_counter()
        try:
            runner = _CudaGraphRunner(self._forward, padded, self._graph_pool, self.spec.graph_warmup_iters)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be captured still runs eagerly
            _LOGGER.warning("CUDA graph capture failed at batch %d (%s); running eagerly", bucket, exc)
            self._graphs_failed = True
            return None
        took = time.perf_counter() - t0
        _LOGGER.info(
            "captured CUDA graph for batch %d in %.2fs",
            bucket,
            took,
            extra={"batch": bucket, "seconds": round(took, 3)},
        )
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
