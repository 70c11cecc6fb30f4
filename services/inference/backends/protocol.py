"""The `Backend` protocol: what a model stage calls, whatever runs the model (docs/architecture.md section 4)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch

from services.inference.backends.spec import BackendSpec

__all__ = ["Backend", "ExampleInputsFn"]

# example_inputs_fn(batch) -> the model's positional inputs for that batch size (float32, any device).
ExampleInputsFn = Callable[[int], Sequence[torch.Tensor]]


@runtime_checkable
class Backend(Protocol):
    """A model behind a `BackendSpec`: float32 batches in, the model's output rows out.

    Every backend pads batches to the spec's buckets (`bucket_for`) and returns exactly the rows it
    was given. `name`, `device` and `precision` are the spec's (what the stage reports).
    """

    spec: BackendSpec

    # Read-only: SpecBackend derives them from its spec.
    @property
    def name(self) -> str: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def precision(self) -> str: ...

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Inputs float32 on any device (batch first) -> output float32 on the CPU."""
        ...

    def forward_device(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Like `__call__`, but the output stays on the device in the backend's dtype."""
        ...

    def warmup(self, example_inputs_fn: ExampleInputsFn) -> dict[int, float]:
        """Run every one of `spec.warmup_batches` once (capture, compile, build); seconds per batch."""
        ...

    def describe(self) -> str:
        """One phrase: kind, options and device (`BackendSpec.describe`)."""
        ...

    def bucket_for(self, n: int) -> int:
        """The padded batch size for n rows."""
        ...
