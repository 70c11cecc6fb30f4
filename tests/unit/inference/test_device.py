"""services.inference.device: the pipeline depth's auto default and the streams that overlap batches."""

from __future__ import annotations

import pytest
import torch

from services.inference.backends import make_backend
from services.serving.settings import ModelStageSettings
from services.inference.device import resolve_pipeline_depth
from services.inference.engine import BatchStreams
from services.inference.stage import finish_backend_start
from services.serving.metrics import Metrics


def test_auto_pipeline_depth_is_two_on_cuda_and_one_on_the_cpu() -> None:
    assert resolve_pipeline_depth(0, torch.device("cpu")) == 1
    assert resolve_pipeline_depth(0, torch.device("cuda")) == 2  # a device object needs no GPU
    assert resolve_pipeline_depth(3, torch.device("cpu")) == 3
    assert resolve_pipeline_depth(1, torch.device("cuda")) == 1
    with pytest.raises(ValueError, match="pipeline_depth"):
        resolve_pipeline_depth(-1, torch.device("cpu"))


def test_batch_streams_are_off_on_the_cpu_and_compute_is_serialised() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tests.helpers.occupancy import Occupancy

    streams = BatchStreams(torch.device("cpu"), overlap=True)
    assert not streams.enabled
    occupancy = Occupancy()

    def model_turn(_: int) -> None:
        with streams.io(), streams.compute(), occupancy.inside(0.01):
            pass

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(model_turn, range(8)))
    assert occupancy.peak == 1  # one model call at a time, whatever the callers' threads


@pytest.mark.gpu
def test_batch_streams_give_each_thread_its_io_stream_and_one_compute_stream() -> None:
    from concurrent.futures import ThreadPoolExecutor

    import threading

    streams = BatchStreams(torch.device("cuda"), overlap=True)
    default = torch.cuda.current_stream()
    both = threading.Barrier(2)  # two threads for sure

    def seen(_: int) -> tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream]:
        both.wait()
        with streams.io():
            io = torch.cuda.current_stream()
            with streams.compute():
                compute = torch.cuda.current_stream()
            return io, compute, torch.cuda.current_stream()

    with ThreadPoolExecutor(2) as pool:
        (io_a, compute_a, back_a), (io_b, compute_b, back_b) = pool.map(seen, range(2))
    assert io_a != io_b and default not in (io_a, io_b)  # one I/O stream per thread
    assert compute_a == compute_b not in (io_a, io_b)  # one compute stream
    assert (back_a, back_b) == (io_a, io_b)  # back on the thread's own stream afterwards


def test_start_up_guard_refuses_a_backend_too_far_from_the_fp32_model() -> None:
    """The numerics guard, run as the services run it (bf16 on the CPU stands in for a GPU backend)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 3, 3, padding=1))
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


def _start(kind: str, picks: dict[bool, str], failing: set[str]):  # type: ignore[no-untyped-def]
    import asyncio

    from services.inference.stage import start_backend

    built: list[tuple[bool, str]] = []

    def build(allow_compile: bool) -> _Fake:
        built.append((allow_compile, picks[allow_compile]))
        return _Fake(picks[allow_compile])

    async def warm(backend: _Fake) -> None:
        if backend.name in failing:
            raise RuntimeError("InductorError: Failed to find C compiler")

    return asyncio.run(start_backend(kind, build, warm)), built  # type: ignore[arg-type]


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
