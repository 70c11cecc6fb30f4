"""The lipsync service's pipeline settings, loaded in-process on the CPU (procedural model, no detector)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from services.common.config import Device, parse_settings
from services.common.metrics import Metrics
from services.lipsync import service as lipsync_service
from services.lipsync.service import LipSyncService, LipSyncSettings


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
    real_make_backend = lipsync_service.make_backend

    def make_backend(*args: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        return real_make_backend(*args, **kwargs)

    monkeypatch.setattr(lipsync_service, "make_backend", make_backend)
    settings = LipSyncSettings(device=Device.CPU, detector="none", pipeline_depth=depth, compile_cache_dir=str(tmp_path))
    svc = LipSyncService(settings, Metrics("lipsync"))

    async def main() -> None:
        await svc.load()
        try:
            assert svc.batcher.concurrency == concurrency
            assert not svc.engine.streams.enabled
        finally:
            await svc.close()

    asyncio.run(main())
    assert seen["cache_dir"] == str(tmp_path)
