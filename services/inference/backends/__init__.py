"""How a stage runs its torch model (docs/architecture.md section 4): one decision, then a backend that reads it.

    spec = resolve_backend_spec(settings.backend, device, model=model, max_batch=..., ...)  # logs one line
    backend = build_backend(spec, model)   # TorchBackend / CompiledBackend / TensorRTBackend
    backend.warmup(example_inputs_fn)      # every one of spec.warmup_batches

Modules: `spec` (BackendSpec, resolve_backend_spec, the bucket rule, the compile cache key),
`protocol` (the Backend protocol), `torch_backend` (the shared spec-driven base and the eager/CUDA
graph backend), `compiled` (torch.compile), `tensorrt` (ONNX -> TensorRT), `numerics` (the
start-up guard). The choice is logged once and exported as `lipline_backend_info`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from services.inference.backends.compiled import CompiledBackend
from services.inference.backends.numerics import numerics_check, reference_output, relative_error, strict_fp32
from services.inference.backends.protocol import Backend, ExampleInputsFn
from services.inference.backends.spec import (
    BACKEND_KINDS,
    DEFAULT_BUCKETS,
    DEFAULT_COMPILE_MODE,
    PRECISIONS,
    BackendSpec,
    auto_kind,
    bucket_for,
    compile_cache_key,
    compile_mode_allows_graphs,
    default_buckets,
    resolve_backend_spec,
)
from services.inference.backends.tensorrt import TensorRTBackend, export_onnx
from services.inference.backends.torch_backend import SpecBackend, TorchBackend

__all__ = [
    "BACKEND_KINDS",
    "DEFAULT_BUCKETS",
    "DEFAULT_COMPILE_MODE",
    "PRECISIONS",
    "Backend",
    "BackendSpec",
    "CompiledBackend",
    "ExampleInputsFn",
    "SpecBackend",
    "TensorRTBackend",
    "TorchBackend",
    "auto_kind",
    "bucket_for",
    "build_backend",
    "compile_cache_key",
    "compile_mode_allows_graphs",
    "default_buckets",
    "export_onnx",
    "make_backend",
    "numerics_check",
    "reference_output",
    "relative_error",
    "resolve_backend_spec",
    "strict_fp32",
]


def build_backend(spec: BackendSpec, module: nn.Module) -> SpecBackend:
    """The one factory: the backend class of `spec.kind`, built from `module` (which it copies)."""
    if spec.kind == "compile":
        return CompiledBackend(module, spec)
    if spec.kind == "tensorrt":
        return TensorRTBackend(module, spec)
    return TorchBackend(module, spec)


def make_backend(
    kind: str,
    module: nn.Module,
    device: torch.device | str,
    *,
    batch_buckets: Sequence[int] | None = None,
    cache_dir: str | os.PathLike | None = None,
    **options: Any,
) -> SpecBackend:
    """`build_backend(resolve_backend_spec(kind, device, model=module, ...), module)` in one call.

    For tests, benchmarks and tools; `options` are `resolve_backend_spec`'s (precision, max_batch,
    channels_last, fold_bn, cuda_graphs, compile_mode, allow_compile).
    """
    spec = resolve_backend_spec(kind, device, model=module, batch_buckets=batch_buckets, cache_dir=cache_dir, **options)
    return build_backend(spec, module)
