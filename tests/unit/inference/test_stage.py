"""services.inference.stage: a model stage's backend start-up (the numerics guard, auto's fallback
from a compiled backend that fails to start)."""

from __future__ import annotations

import pytest
import torch

from services.inference.backends import make_backend
from services.inference.stage import finish_backend_start
from services.serving.metrics import Metrics
from services.serving.settings import ModelStageSettings


def test_start_up_guard_refuses_a_backend_too_far_from_the_fp32_model() -> None:
    """The numerics guard, run as the services run it (bf16 on the CPU stands in for a GPU backend)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 3, 3, padding=1)
    )
    inputs = [torch.rand(2, 3, 16, 16)]
    backend = make_backend("torch", model, "cpu", precision="bf16")
    metrics = Metrics("guard")
    finish_backend_start(backend, model, inputs, ModelStageSettings(max_rel_error=5e-2), metrics)
    err = metrics.registry.get_sample_value("lipline_numerics_relative_error", {"stage": "guard"})
    assert err is not None and 0 < err < 5e-2  # bf16 rounding: measured, exported, within the bound
    with pytest.raises(RuntimeError, match="relative error"):
        finish_backend_start(backend, model, inputs, ModelStageSettings(max_rel_error=err / 10), metrics)
    # An fp32 CPU backend is the reference computation itself: nothing to check, nothing exported.
    fp32 = make_backend("cpu", model, "cpu")
    quiet = Metrics("fp32")
    finish_backend_start(fp32, model, inputs, ModelStageSettings(max_rel_error=1e-9), quiet)
    assert quiet.registry.get_sample_value("lipline_numerics_relative_error", {"stage": "fp32"}) is None


class _Fake:
    def __init__(self, name: str) -> None:
        self.name = name


def _start(kind: str, picks: dict[bool, str], failing: set[str]):
    import asyncio

    from services.inference.stage import start_backend

    built: list[tuple[bool, str]] = []

    def build(allow_compile: bool) -> _Fake:
        built.append((allow_compile, picks[allow_compile]))
        return _Fake(picks[allow_compile])

    async def warm(backend: _Fake) -> None:
        if backend.name in failing:
            raise RuntimeError("InductorError: Failed to find C compiler")

    return asyncio.run(start_backend(kind, build, warm)), built


def test_auto_falls_back_to_torch_when_the_compiled_backend_fails_to_start() -> None:
    backend, built = _start("auto", {True: "compile", False: "torch"}, failing={"compile"})
    assert backend.name == "torch" and built == [(True, "compile"), (False, "torch")]


def test_an_explicit_compile_or_a_failing_torch_still_fails() -> None:
    with pytest.raises(RuntimeError, match="C compiler"):
        _start("compile", {True: "compile", False: "torch"}, failing={"compile"})
    with pytest.raises(RuntimeError, match="C compiler"):
        _start("auto", {True: "torch", False: "torch"}, failing={"torch"})
    backend, built = _start("auto", {True: "compile", False: "torch"}, failing=set())
    assert backend.name == "compile" and built == [(True, "compile")]
