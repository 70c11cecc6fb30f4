"""Choosing the torch device from settings, how many batches it keeps in flight, and the cuDNN
self-check that runs on GPUs. The engine's streams and size grouping live in `engine`, the backend's
start-up beside `ModelStage` in `stage`."""

from __future__ import annotations

import logging

import torch

from services.serving.metrics import Metrics
from services.serving.settings import Device, ServiceSettings

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
        _LOGGER.log(
            level, "cuDNN self-check: %s", detail, extra={"cudnn_ok": ok, "gpu": torch.cuda.get_device_name(device)}
        )
        if not ok and settings.require_cudnn:
            raise RuntimeError(f"cuDNN self-check failed and require_cudnn is set: {detail}")
    return device
