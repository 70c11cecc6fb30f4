"""The shape of a model stage (lipsync, superres): its service base, its servicer base and the
framing of its streaming RPC.

`ModelStage` owns what both stages do around their model: the backend's build, warm-up and numerics
guard (`start_model`, through `stage_backend_builder`, `start_backend` and `finish_backend_start`
here), the dynamic batcher and the `ModelInfo` (`start_batcher`), `close`. A stage
supplies its model, its warm-up passes and its guard inputs.

A servicer supplies `run` (decode one request message, submit it to the batcher, return its item
keys and the engine's `PackedImages`) and `build` (one response from a run of those items); the
rest is here: the ordered, pipelined stream (`ordered_stream`), the cut of each message's images
into responses of at most half the message limit (`byte_ranges`, in item order, each response built
only when it is sent) and the model's `ModelInfo` on the first response.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence, Sized
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import torch
from torch import nn

from lipline.v1 import common_pb2
from services.inference.backends import (
    DEFAULT_COMPILE_MODE,
    Backend,
    CompiledBackend,
    build_backend,
    numerics_check,
    resolve_backend_spec,
)
from services.inference.batcher import DynamicBatcher
from services.inference.device import prepare_device, resolve_pipeline_depth
from services.media.packed import PackedImages
from services.serving.metrics import Metrics
from services.serving.server import Service
from services.serving.settings import ModelStageSettings
from services.serving.streams import byte_ranges, item_count, message_budget, ordered_stream

_LOGGER = logging.getLogger(__name__)
Req = TypeVar("Req")
Svc = TypeVar("Svc")
S = TypeVar("S", bound=ModelStageSettings)
Chunk = TypeVar("Chunk", bound=Sized)  # the batcher counts a chunk's items with len()
Resp = TypeVar("Resp", bound="_HasModel")

# Per request message: its items' keys (one or more index lists, one entry per item) and their images.
Keys = Sequence[Sequence[int]]
Result = tuple[Keys, PackedImages]


class _HasModel(Protocol):
    @property
    def model(self) -> common_pb2.ModelInfo: ...


class StageServicer(Generic[Svc]):
    """Base of a stage's servicer (before the generated grpc base class): the service it answers for."""

    def __init__(self, service: Svc) -> None:
        self._service = service


def cut_responses(
    keys: Keys,
    images: PackedImages,
    budget: int,
    overhead: int,
    build: Callable[[Keys, PackedImages], Resp],
) -> Iterator[Resp]:
    """One request message's images as responses of at most `budget` bytes of images (each image
    plus `overhead`) each, an image larger than that alone, in item order; `build(keys, images)`
    makes one response from a run of items. A message without items gets one empty response."""
    if len(images) != len(keys[0]):
        raise RuntimeError(f"the engine returned {len(images)} images for {len(keys[0])} items")
    for a, b in byte_ranges(images.nbytes(), budget, overhead) or [(0, 0)]:
        # The usual case is one range: the whole blob as it is (`slice` copies no bytes then).
        yield build([k[a:b] for k in keys], images.slice(a, b))


async def model_stream(
    requests: AsyncIterator[Req],
    run: Callable[[Req], Awaitable[Result | None]],
    build: Callable[[Keys, PackedImages], Resp],
    *,
    settings: ModelStageSettings,
    model_info: common_pb2.ModelInfo,
    overhead: int,
    size_of: Callable[[Req], int] = item_count,
) -> AsyncIterator[Resp]:
    """The responses of one model-stage stream: `run` on each request message (several at once, in
    order; None = no answer), its images cut by bytes (`cut_responses`), `model_info` on the first.

    Args:
        settings: the stage's settings (max_message_bytes, max_pending_per_stream).
        overhead: bytes of field tags and varints per item around its image bytes.
        size_of: items of one request message, for the stream's max_pending budget.
    """
    first = True
    budget = message_budget(settings.max_message_bytes)
    async for keys, images in ordered_stream(requests, run, settings.max_pending_per_stream, size_of=size_of):
        for response in cut_responses(keys, images, budget, overhead, build):
            if first:
                response.model.CopyFrom(model_info)
                first = False
            yield response


def finish_backend_start(
    backend: Backend,
    reference: nn.Module | None,
    inputs: Sequence[torch.Tensor],
    settings: ModelStageSettings,
    metrics: Metrics,
) -> None:
    """After a model stage's warm-up passes: keep a fresh compile's artifacts, then the numerics guard.

    The guard skips an fp32 backend on the CPU (that *is* the reference computation); otherwise
    `numerics_check` raises, and so stops the start-up, when the backend's relative error against
    `reference` on `inputs` exceeds `max_rel_error`; 0 turns it off. `reference` is the model with
    its true fp32 weights, as loaded (on the CPU): not a module already cast to the backend's
    precision, whose rounding the guard would then miss.
    """
    if isinstance(backend, CompiledBackend) and not backend.cache_loaded:
        backend.save_cache()
    as_reference = backend.device.type == "cpu" and backend.precision == "fp32"
    if reference is None or as_reference or settings.max_rel_error <= 0:
        return
    started = time.perf_counter()
    err = numerics_check(backend, reference, inputs, bound=settings.max_rel_error)
    metrics.numerics_error.labels(metrics.stage).set(err)
    _LOGGER.info(
        "numerics check passed",
        extra={
            "relative_error": err,
            "bound": settings.max_rel_error,
            "seconds": round(time.perf_counter() - started, 2),
        },
    )


def stage_backend_builder(
    settings: ModelStageSettings,
    device: torch.device,
    model: nn.Module,
    *,
    precision: str | None = None,
    cuda_graphs: bool | None = None,
    compile_mode: str = DEFAULT_COMPILE_MODE,
    buckets: tuple[int, ...] | None = None,
) -> Callable[[bool], Backend]:
    """`build(allow_compile)` for `start_backend`: a model stage's settings -> `resolve_backend_spec`
    (which decides and logs) -> `build_backend`. Both GPU stages build their backend through this.

    Args:
        settings: the stage's backend, max_batch, batch_buckets and compile_cache_dir.
        device: from `prepare_device`.
        model: the fp32 model as loaded (the backend works on a copy).
        precision: None = the spec's default (fp16 on CUDA, fp32 on the CPU).
        cuda_graphs: None = the spec's default; False for a model that cannot be captured.
        compile_mode: torch.compile's mode where the backend is `compile`.
        buckets: a second model of the stage with batch sizes of its own (the musetalk tier's whisper
            encoder: windows per pass): its largest is the max batch, and on CUDA they are its static
            buckets; None = the settings' max_batch and batch_buckets.
    """
    max_batch, batch_buckets = settings.max_batch, settings.batch_buckets or None
    if buckets is not None:
        max_batch, batch_buckets = buckets[-1], buckets if device.type == "cuda" else None

    def build(allow_compile: bool) -> Backend:
        spec = resolve_backend_spec(
            settings.backend,
            device,
            model=model,
            precision=precision,
            max_batch=max_batch,
            batch_buckets=batch_buckets,
            cache_dir=settings.compile_cache_dir or None,
            cuda_graphs=cuda_graphs,
            compile_mode=compile_mode,
            allow_compile=allow_compile,
        )
        return build_backend(spec, model)

    return build


async def start_backend(
    kind: str, build: Callable[[bool], Backend], warm: Callable[[Backend], Awaitable[None]]
) -> Backend:
    """Build and warm up a stage's backend; `auto`'s compile pick falls back to `torch` if it fails.

    `build(allow_compile)` makes the backend (`stage_backend_builder`) and `warm` runs its warm-up
    (over `backend.spec.warmup_batches`), where a compile actually happens. `auto` picks `compile`
    only on a warm cache, but a cache can still fail here (an image without the C compiler Triton
    needs, artifacts from another driver): serving fp16 + CUDA graphs beats a pod that crash-loops.
    An explicit `--backend compile` still fails, as asked.
    """
    backend = build(True)
    try:
        await warm(backend)
    except Exception as exc:
        if kind != "auto" or backend.name != "compile":
            raise
        _LOGGER.warning(
            "backend auto: the compiled backend failed to start (%s: %s); falling back to torch",
            type(exc).__name__,
            exc,
            extra={"backend": "torch", "fallback_from": "compile"},
        )
        backend = build(False)
        await warm(backend)
    return backend


class ModelStage(Service[S], Generic[S, Chunk]):
    """Base of a model stage's service: device, backend start, batcher, ModelInfo and close.

    A subclass sets `grpc_service` (its service's descriptor) and implements `register` and `load`:
    `prepare()` (device and pipeline depth), its model, `start_model` (build, warm up, guard), then
    `start_batcher` with its engine's `run`.
    """

    grpc_service: ClassVar[Any]  # the generated module's ServiceDescriptor

    @property
    def service_names(self) -> Sequence[str]:
        return [self.grpc_service.full_name]

    def prepare(self) -> tuple[torch.device, int]:
        """The device (after the cuDNN self-check) and the model batches in flight at once on it."""
        device = prepare_device(self.settings, self.metrics)
        return device, resolve_pipeline_depth(self.settings.pipeline_depth, device)

    async def start_model(
        self,
        device: torch.device,
        model: nn.Module,
        warm: Callable[[Backend], Awaitable[None]],
        guard_inputs: Sequence[torch.Tensor],
        *,
        precision: str | None = None,
        cuda_graphs: bool | None = None,
        compile_mode: str = DEFAULT_COMPILE_MODE,
        buckets: tuple[int, ...] | None = None,
    ) -> Backend:
        """Build the backend of `model` (settings -> `stage_backend_builder`), run `warm` on it (one
        pass per `backend.spec.warmup_batches`, where a compile happens; `auto` falls back from a
        failed compile), then the numerics guard against `model` on `guard_inputs`."""
        build = stage_backend_builder(
            self.settings,
            device,
            model,
            precision=precision,
            cuda_graphs=cuda_graphs,
            compile_mode=compile_mode,
            buckets=buckets,
        )
        backend = await start_backend(self.settings.backend, build, warm)
        await asyncio.to_thread(finish_backend_start, backend, model, guard_inputs, self.settings, self.metrics)
        return backend

    def start_batcher(
        self,
        run: Callable[[list[Chunk]], list[PackedImages]],
        depth: int,
        model: str,
        backend: str,
        precision: str,
    ) -> None:
        """Serve: the ModelInfo of every stream's first response, the metrics' backend labels, and
        the dynamic batcher over the engine's `run` (`depth` batches in flight)."""
        s = self.settings
        self.model_info = common_pb2.ModelInfo(name=model, backend=backend, precision=precision)
        self.batcher: DynamicBatcher[Chunk, PackedImages] = DynamicBatcher(
            run, self.metrics, s.max_batch, s.max_delay_ms / 1000, size_of=len, concurrency=depth
        )
        self.batcher.start()
        self.metrics.set_backend(model, backend, precision)

    async def close(self) -> None:
        if hasattr(self, "batcher"):
            await self.batcher.close()
