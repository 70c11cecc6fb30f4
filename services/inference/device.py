"""Choosing the torch device from settings, the cuDNN self-check that runs on GPUs, and stream helpers."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence

import torch

from torch import nn

from services.inference.backends import Backend, CompiledBackend, build_backend, numerics_check, resolve_backend_spec
from services.serving.settings import Device, ModelStageSettings, ServiceSettings
from services.serving.metrics import Metrics

_LOGGER = logging.getLogger(__name__)


def resolve_device(choice: Device) -> torch.device:
    """auto -> cuda when available, else cpu; cuda without a GPU is a start-up error, not a slow surprise."""
    if choice is Device.CUDA and not torch.cuda.is_available():
        raise RuntimeError("device=cuda was requested but torch sees no CUDA GPU")
    if choice is Device.CPU or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def resolve_pipeline_depth(depth: int, device: torch.device) -> int:
    """A `pipeline_depth` setting -> model batches in flight: 0 (auto) is 2 on CUDA, 1 on the CPU.

    On CUDA a second batch's uploads and host work overlap the first one's compute (+36 % lipsync
    frames/s on an H200: docs/performance.md); on the CPU both batches would share the same cores.
    """
    if depth < 0:
        raise ValueError(f"pipeline_depth must be >= 0 (0 = auto), got {depth}")
    if depth:
        return depth
    return 2 if device.type == "cuda" else 1


class BatchStreams:
    """The CUDA streams with which a model stage overlaps consecutive batches (pipeline_depth > 1).

    Each batch thread does its uploads, pre/post-processing and copy back on its own I/O stream
    (`io()`), and the model runs on one compute stream under a lock (`compute()`), because CUDA
    graphs reuse their static buffers: batch k+1's transfers and host work overlap batch k's
    compute. Disabled (overlap off, or the CPU), everything runs on the current stream and
    `compute()` is only the lock.
    """

    def __init__(self, device: torch.device, overlap: bool) -> None:
        self.device = device
        self.enabled = bool(overlap) and device.type == "cuda"
        self._compute = torch.cuda.Stream(device) if self.enabled else None
        self._lock = threading.Lock()
        self._local = threading.local()

    def io(self) -> contextlib.AbstractContextManager:
        """Run on this thread's I/O stream (made on first use); no change when disabled."""
        if not self.enabled:
            return contextlib.nullcontext()
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream(self.device)
        return torch.cuda.stream(stream)

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """The model's turn: under the lock, on the compute stream after it has waited for the
        caller's stream; on leaving, the caller's stream waits for the compute stream. A tensor made
        inside and read by the caller afterwards should be `record_stream`-ed on the caller's stream."""
        with self._lock:
            if self._compute is None:
                yield
                return
            caller = torch.cuda.current_stream(self.device)
            self._compute.wait_stream(caller)
            with torch.cuda.stream(self._compute):
                yield
            caller.wait_stream(self._compute)


Size = tuple[int, int]  # (width, height), cv2 order


def group_rows_by_size(rows: torch.Tensor, sizes: Sequence[Size], pin: bool) -> tuple[torch.Tensor, list[tuple[Size, list[int]]]]:
    """Reorder `rows` (batch first) so that the rows of each output size are one contiguous slice.

    Returns the reordered rows and the groups in their order: [(size, positions in `rows`)]. Both
    engines resize per output size; one gather beats a gather per size. The index goes up through
    pinned memory without blocking: `torch.tensor(..., device=cuda)` would make the host wait for
    all queued work (the network) before it could queue the resizes.
    """
    groups: dict[Size, list[int]] = defaultdict(list)
    for k, size in enumerate(sizes):
        groups[size].append(k)
    if len(groups) > 1:
        order = torch.tensor([k for ks in groups.values() for k in ks], dtype=torch.int64)
        if pin:
            order = order.pin_memory()
        rows = rows.index_select(0, order.to(rows.device, non_blocking=True))
    return rows, list(groups.items())


def cudnn_self_check(device: torch.device) -> tuple[bool, str]:
    """Run one small convolution through cuDNN; returns (ok, detail). Always (True, 'cpu') off-GPU."""
    if device.type != "cuda":
        return True, "cpu"
    if not torch.backends.cudnn.is_available() or not torch.backends.cudnn.enabled:
        return False, "cuDNN is not available or disabled in this torch build"
    try:
        x = torch.randn(1, 3, 16, 16, device=device)
        w = torch.randn(4, 3, 3, 3, device=device)
        torch.nn.functional.conv2d(x, w)
        torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001
        return False, f"cuDNN convolution failed: {exc}"
    return True, f"cuDNN {torch.backends.cudnn.version()}"


def prepare_device(settings: ServiceSettings, metrics: Metrics) -> torch.device:
    """The device a model stage runs on, after the cuDNN self-check (logged and exported).

    With `require_cudnn` a failed check stops the start-up: a GPU service without cuDNN is about
    8 times slower (measured on an H200) and would otherwise go unnoticed.
    """
    device = resolve_device(settings.device)
    ok, detail = cudnn_self_check(device)
    if device.type == "cuda":
        metrics.cudnn_ok.labels(metrics.stage).set(1 if ok else 0)
        level = logging.INFO if ok else logging.ERROR
        _LOGGER.log(level, "cuDNN self-check: %s", detail, extra={"cudnn_ok": ok, "gpu": torch.cuda.get_device_name(device)})
        if not ok and settings.require_cudnn:
            raise RuntimeError(f"cuDNN self-check failed and require_cudnn is set: {detail}")
    return device


def finish_backend_start(backend: Backend, reference: nn.Module | None, inputs: Sequence[torch.Tensor], settings: ModelStageSettings, metrics: Metrics) -> None:
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
    err = numerics_check(backend, reference, inputs, bound=settings.max_rel_error)
    metrics.numerics_error.labels(metrics.stage).set(err)
    _LOGGER.info("numerics check passed", extra={"relative_error": err, "bound": settings.max_rel_error})


def stage_backend_builder(
    settings: ModelStageSettings,
    device: torch.device,
    model: nn.Module,
    *,
    precision: str | None = None,
    cuda_graphs: bool | None = None,
) -> Callable[[bool], Backend]:
    """`build(allow_compile)` for `start_backend`: a model stage's settings -> `resolve_backend_spec`
    (which decides and logs) -> `build_backend`. Both GPU stages build their backend through this.

    Args:
        settings: the stage's backend, max_batch, batch_buckets and compile_cache_dir.
        device: from `prepare_device`.
        model: the fp32 model as loaded (the backend works on a copy).
        precision: None = the spec's default (fp16 on CUDA, fp32 on the CPU).
        cuda_graphs: None = the spec's default; False for a model that cannot be captured.
    """

    def build(allow_compile: bool) -> Backend:
        spec = resolve_backend_spec(
            settings.backend,
            device,
            model=model,
            precision=precision,
            max_batch=settings.max_batch,
            batch_buckets=settings.batch_buckets or None,
            cache_dir=settings.compile_cache_dir or None,
            cuda_graphs=cuda_graphs,
            allow_compile=allow_compile,
        )
        return build_backend(spec, model)

    return build


async def start_backend(kind: str, build: Callable[[bool], Backend], warm: Callable[[Backend], Awaitable[None]]) -> Backend:
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
