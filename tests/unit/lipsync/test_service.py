"""The lipsync service's pipeline settings, loaded in-process on the CPU (procedural model, no detector)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from services.inference import stage as model_stage_module
from services.lipsync.service import LipSyncService
from services.lipsync.settings import LipSyncSettings
from services.serving.metrics import Metrics
from services.serving.settings import Device, parse_settings


def test_settings_defaults_and_flags() -> None:
    s = LipSyncSettings()
    assert s.pipeline_depth == 0 and s.compile_cache_dir == "var/compile-cache"
    assert parse_settings(LipSyncSettings, ["--pipeline-depth", "2"], environ={}).pipeline_depth == 2
    with pytest.raises(SystemExit):
        parse_settings(LipSyncSettings, ["--pipeline-depth", "-1"], environ={})


@pytest.mark.parametrize(("depth", "concurrency"), [(0, 1), (2, 2)])
def test_pipeline_depth_on_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, depth: int, concurrency: int) -> None:
    """0 (auto) is one batch at a time on the CPU; an explicit depth is kept (the overlap stays off there)."""
    seen: dict[str, Any] = {}
    real_resolve = model_stage_module.resolve_backend_spec

    def resolve_backend_spec(*args: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        return real_resolve(*args, **kwargs)

    monkeypatch.setattr(model_stage_module, "resolve_backend_spec", resolve_backend_spec)
    settings = LipSyncSettings(
        device=Device.CPU, detector="none", pipeline_depth=depth, compile_cache_dir=str(tmp_path)
    )
    svc = LipSyncService(settings, Metrics("lipsync"))

    async def main() -> None:
        await svc.load()
        try:
            assert svc.batcher.concurrency == concurrency
            assert not svc.engine.streams.enabled
            assert svc.engine.backend is svc.backend and svc.backend.name == "cpu"
        finally:
            await svc.close()

    asyncio.run(main())
    assert seen["cache_dir"] == str(tmp_path)
