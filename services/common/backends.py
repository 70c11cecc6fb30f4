"""How a stage runs its torch model: the Backend interface (DESIGN.md section 4).

Today: `cpu` and `torch` (eager; fp16 on CUDA). The GPU-specific backends (compile, tensorrt) plug in
behind the same two methods. The choice is logged and exported as `lipline_backend_info`.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

_LOGGER = logging.getLogger(__name__)


class TorchBackend:
    """Runs an eval-mode module under inference_mode on one device, in fp32 (CPU) or fp16 (CUDA)."""

    def __init__(self, module: nn.Module, device: torch.device, precision: str | None = None) -> None:
        self.device = device
        self.precision = precision or ("fp16" if device.type == "cuda" else "fp32")
        self.dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[self.precision]
        self.name = "torch" if device.type == "cuda" else "cpu"
        module = module.eval().to(device=device, dtype=self.dtype)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True
            module = module.to(memory_format=torch.channels_last)
        self.module = module

    @torch.inference_mode()
    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Inputs float32 on any device -> output float32 on the CPU."""
        moved = [x.to(self.device, dtype=self.dtype, non_blocking=True) for x in inputs]
        return self.module(*moved).float().cpu()
