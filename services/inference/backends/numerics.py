"""The start-up numerics guard: a backend against the true fp32 model, on the same inputs."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from services.inference.backends.protocol import Backend

__all__ = ["cudnn_flag", "numerics_check", "reference_output", "relative_error", "strict_fp32"]


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
    """The fp32 (no TF32) output of an eval-mode copy of `reference` on `device`, as a CPU tensor.

    The copy lives on `device` only for this call. `reference` must hold the true fp32 weights: a
    module already cast to fp16 and back would measure the arithmetic, not the rounding.
    """
    model = copy.deepcopy(reference).eval().to(device=device, dtype=torch.float32)
    # cuDNN autotune off: a one-off pass would otherwise time every algorithm of each of its fp32
    # convolutions first (the 256 px tier's generator on an H100: 19.9 s with it, 0.2 s without).
    with strict_fp32(), cudnn_flag("benchmark", False):
        out = model(*[x.to(device, torch.float32) for x in inputs])
    return out.float().cpu()


@contextlib.contextmanager
def cudnn_flag(name: str, value: bool) -> Iterator[None]:
    """`torch.backends.cudnn.<name>` (enabled, benchmark, deterministic) set to `value` inside the block,
    restored after. (torch's own `cudnn.flags` sets all of them at once, allow_tf32 included, which
    would undo `strict_fp32`.)"""
    saved = getattr(torch.backends.cudnn, name)
    setattr(torch.backends.cudnn, name, value)
    try:
        yield
    finally:
        setattr(torch.backends.cudnn, name, saved)


def numerics_check(
    backend: Backend, reference: nn.Module, inputs: Sequence[torch.Tensor], bound: float = 1e-2
) -> float:
    """Relative error of `backend` against the fp32 `reference` module on the same inputs.

    Raises RuntimeError naming the backend and both numbers when the error exceeds `bound` (or is
    not finite). `reference` is not modified (an fp32 copy runs on the backend's device).
    """
    if any(p.dtype != torch.float32 for p in reference.parameters()):
        raise ValueError("the numerics reference must hold fp32 weights (pass the model as loaded, before any cast)")
    ref = reference_output(reference, inputs, backend.device)
    out = backend(*inputs)
    err = relative_error(out, ref)
    if not math.isfinite(err) or err > bound:
        raise RuntimeError(
            f"numerics check failed for {backend.describe()}: relative error {err:.3e} exceeds bound {bound:.1e} "
            f"(||out - ref|| / ||ref|| over {ref.numel()} values)"
        )
    return err
