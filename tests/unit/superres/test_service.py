"""The superres service in-process on the CPU: its settings, what load() builds, and Upscale's responses.

The network is a small seeded SRVGGNetCompact (create_upscaler is replaced), so load() goes through
resolve_backend_spec, build_backend and the engine as in production. Upscale is driven through the servicer directly (no
socket); each test runs its own event loop.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lipline.v1 import common_pb2, superres_pb2
from services.inference import stage as model_stage_module
from services.inference.backends import make_backend, numerics_check
from services.inference.checkpoints import seeded_state_dict
from services.media.wire import image_to_proto
from services.serving.metrics import Metrics
from services.serving.settings import Device, parse_settings
from services.superres import service as superres_service
from services.superres.engine import SuperResEngine, UpscaleChunk
from services.superres.models import SRVGGNetCompact
from services.superres.service import SuperResService, SuperResServicer
from services.superres.settings import SuperResSettings
from services.superres.upscaler import ModelUpscaler


def _srvgg() -> SRVGGNetCompact:
    model = SRVGGNetCompact(num_conv=3)
    model.load_state_dict(seeded_state_dict(model, scale=0.05))
    return model.eval()


def _crop(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_settings_defaults_and_flags() -> None:
    s = SuperResSettings()
    assert s.pipeline_depth == 0 and s.compile_cache_dir == "var/compile-cache"
    s = parse_settings(SuperResSettings, ["--pipeline-depth", "3", "--compile-cache-dir", "/cache"], environ={})
    assert s.pipeline_depth == 3 and s.compile_cache_dir == "/cache"
    with pytest.raises(SystemExit):
        parse_settings(SuperResSettings, ["--pipeline-depth", "-1"], environ={})


class _Loaded:
    """A SuperResService loaded on the CPU with a small model, plus what resolve_backend_spec was given
    and what the numerics guard was handed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> None:
        self.backend_kwargs: dict[str, Any] = {}
        self.guard: tuple[Any, ...] = ()
        self.upscaler_args: tuple[Any, ...] = ()
        real_resolve, real_finish = model_stage_module.resolve_backend_spec, model_stage_module.finish_backend_start

        def resolve_backend_spec(*args: Any, **kwargs: Any) -> Any:
            self.backend_kwargs = kwargs
            return real_resolve(*args, **kwargs)

        def finish_backend_start(*args: Any) -> None:
            self.guard = args
            real_finish(*args)

        def create_upscaler(*args: Any) -> ModelUpscaler:
            self.upscaler_args = args
            model_name, checkpoint, device, dtype = args
            return ModelUpscaler(_srvgg(), scale=4, device=device, dtype=dtype)

        monkeypatch.setattr(model_stage_module, "resolve_backend_spec", resolve_backend_spec)
        monkeypatch.setattr(model_stage_module, "finish_backend_start", finish_backend_start)
        monkeypatch.setattr(superres_service, "create_upscaler", create_upscaler)
        self.service = SuperResService(
            SuperResSettings(device=Device.CPU, max_batch=8, **settings), Metrics("superres")
        )


async def _requests(messages: Iterable[superres_pb2.UpscaleRequest]) -> AsyncIterator[superres_pb2.UpscaleRequest]:
    for m in messages:
        yield m


async def _upscale(
    svc: SuperResService, messages: list[superres_pb2.UpscaleRequest]
) -> list[superres_pb2.UpscaleResponse]:
    return [r async for r in SuperResServicer(svc).Upscale(_requests(messages), None)]


def test_load_on_cpu_resolves_auto_depth_and_passes_the_compile_cache_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    loaded = _Loaded(monkeypatch, compile_cache_dir=str(tmp_path))

    async def main() -> None:
        await loaded.service.load()
        try:
            assert loaded.service.batcher.concurrency == 1  # pipeline_depth 0 (auto) is 1 on the CPU
            assert not loaded.service.engine.streams.enabled
        finally:
            await loaded.service.close()

    asyncio.run(main())
    assert loaded.backend_kwargs["cache_dir"] == str(tmp_path)


def test_the_numerics_guard_gets_the_true_fp32_weights_and_the_backend_its_own_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guard's reference is the model as loaded (fp32, on the CPU), never a copy already rounded to
    the serving precision; the backend runs its own copy, so the device holds the weights once."""
    loaded = _Loaded(monkeypatch)

    async def main() -> None:
        await loaded.service.load()
        await loaded.service.close()

    asyncio.run(main())
    assert loaded.upscaler_args[2:] == ("cpu", torch.float32)  # loaded on the CPU in fp32, whatever the device
    backend, reference, inputs, *_ = loaded.guard
    want = _srvgg().state_dict()
    got = reference.state_dict()
    assert all(v.dtype == torch.float32 and v.device.type == "cpu" and torch.equal(v, want[k]) for k, v in got.items())
    served = dict(backend.module.named_parameters())
    assert all(p.data_ptr() != served[k].data_ptr() for k, p in reference.named_parameters())
    assert loaded.service.engine.backend is backend and loaded.service.model_info.backend == backend.name


def test_a_reference_rounded_to_fp16_hides_the_rounding_from_the_guard() -> None:
    """Why the guard needs the true fp32 weights: against fp16-rounded weights the measured error of an
    fp16 backend misses the weight rounding, and an fp16 module is refused as a reference."""
    model = _srvgg()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.rand(p.shape, generator=torch.Generator().manual_seed(1)) * 1e-3)  # not fp16-exact
    inputs = [torch.rand((2, 3, 12, 12), generator=torch.Generator().manual_seed(0))]
    backend = make_backend("torch", model, "cpu", precision="fp16")
    true_err = numerics_check(backend, model, inputs, bound=1.0)
    rounded = copy.deepcopy(model).half().float()  # what the old guard compared against
    assert numerics_check(backend, rounded, inputs, bound=1.0) < true_err
    with pytest.raises(ValueError, match="fp32 weights"):
        numerics_check(backend, copy.deepcopy(model).half(), inputs)


def _messages(stream: int) -> tuple[list[superres_pb2.UpscaleRequest], list[tuple[np.ndarray, tuple[int, int]]]]:
    """Three messages of a stream: native size, paste sizes, and an input of another size."""
    items, messages, index = [], [], 0
    for m in range(3):
        request = superres_pb2.UpscaleRequest()
        for k in range(3):
            crop = _crop(12, 10, 100 * stream + 10 * m + k) if m < 2 else _crop(9, 11, 100 * stream + k)
            size = (0, 0) if m == 0 else (31 + k, 29)
            request.items.add(index=index, image=image_to_proto(crop), out_width=size[0], out_height=size[1])
            items.append((crop, size))
            index += 1
        messages.append(request)
    return messages, items


@pytest.mark.parametrize("depth", [1, 2])
def test_upscale_responses_match_the_engine_at_any_depth(monkeypatch: pytest.MonkeyPatch, depth: int) -> None:
    """Concurrent streams at pipeline_depth 1 and 2 (two batches in the engine at once) give the engine's bytes."""
    loaded = _Loaded(monkeypatch, pipeline_depth=depth, max_delay_ms=1.0)
    streams = [_messages(s) for s in range(4)]

    async def main() -> list[list[superres_pb2.UpscaleResponse]]:
        await loaded.service.load()
        try:
            assert loaded.service.batcher.concurrency == depth
            return await asyncio.gather(*(_upscale(loaded.service, messages) for messages, _ in streams))
        finally:
            await loaded.service.close()

    results = asyncio.run(main())
    reference = SuperResEngine(ModelUpscaler(_srvgg(), scale=4))
    for responses, (_, items) in zip(results, streams):
        assert responses[0].model.name == loaded.service.upscaler.model_name and not responses[1].HasField("model")
        got = [item for r in responses for item in r.items]
        sizes = [(w or crop.shape[1] * 4, h or crop.shape[0] * 4) for crop, (w, h) in items]
        (want,) = reference.run([UpscaleChunk.from_items([c for c, _ in items], sizes)])
        assert [g.index for g in got] == list(range(len(items)))
        assert [(g.out_width, g.out_height) for g in got] == sizes
        assert [(g.image.width, g.image.height) for g in got] == sizes
        assert all(g.image.format == common_pb2.PIXEL_FORMAT_BGR24 for g in got)
        assert b"".join(g.image.data for g in got) == want.data


def test_empty_message_gets_an_empty_response(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = _Loaded(monkeypatch)

    async def main() -> list[superres_pb2.UpscaleResponse]:
        await loaded.service.load()
        try:
            return await _upscale(loaded.service, [superres_pb2.UpscaleRequest()])
        finally:
            await loaded.service.close()

    (response,) = asyncio.run(main())
    assert len(response.items) == 0 and response.HasField("model")
