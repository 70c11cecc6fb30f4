"""`CompiledBackend`: torch.compile over the eager backend, with the compiler's cache kept on disk."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch
from torch import nn

from services.inference.backends.protocol import ExampleInputsFn
from services.inference.backends.spec import BackendSpec
from services.inference.backends.torch_backend import TorchBackend

__all__ = ["CompiledBackend"]

_LOGGER = logging.getLogger("services.inference.backends")


class CompiledBackend(TorchBackend):
    """`TorchBackend` whose forward is `torch.compile(module, mode=spec.compile_mode)`, static shapes.

    mode "max-autotune-no-cudagraphs" (the default) benchmarks Triton/cuBLAS/cuDNN choices per
    shape; "reduce-overhead"/"max-autotune" bring Inductor's own CUDA graphs (the spec then has
    cuda_graphs off: the two must not nest). Without Inductor graphs, the spec's cuda_graphs
    captures the compiled forward per bucket like the eager backend: the compiled code is plain
    kernel launches, and a graph removes their per-launch host cost (which matters for models of
    many small layers). The compiler's cache artifacts (Inductor/AOT caches, autotuning results)
    are loaded from `spec.cache_path` before the first compile and saved there after `warmup`, so a
    restarted pod with the same model/torch/GPU/options skips most of the compile. Compilation
    happens lazily on the first call per bucket: call `warmup` at start-up.
    """

    def __init__(self, module: nn.Module, spec: BackendSpec) -> None:
        if spec.kind != "compile":
            raise ValueError(f"CompiledBackend needs a compile spec, got {spec.kind!r}")
        super().__init__(module, spec)
        self.mode = spec.compile_mode
        self.cache_key = spec.cache_key
        self.cache_path: Path | None = spec.cache_path
        self.cache_loaded = self._load_cache()
        self.compile_seconds: float | None = None
        self._compiled = torch.compile(self.module, mode=self.mode, dynamic=False)

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
        """Write the compiler's cache artifacts to `spec.cache_path` (atomically); None if nothing."""
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

    def warmup(self, example_inputs_fn: ExampleInputsFn) -> dict[int, float]:
        t0 = time.perf_counter()
        took = super().warmup(example_inputs_fn)
        self.compile_seconds = time.perf_counter() - t0
        self.save_cache()
        return took
