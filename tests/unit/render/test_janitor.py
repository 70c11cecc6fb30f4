"""Tests for services.render.janitor on a temporary store: only the lease's holder sweeps, a sweep
deletes expired outputs and ended jobs' leftover files (and counts them), and close gives the
lease up. The lease's race and its expiry are the store's (tests/unit/jobs/store/test_retention.py);
two real workers and a kill are tests/integration/test_retention.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.jobs.layout import output_key
from services.render.janitor import JANITOR_LEASE, Janitor
from services.render.settings import RenderSettings
from services.serving.metrics import Metrics
from tests.helpers.stores import temp_stores
from tests.unit.jobs.store.test_jobs import LONG_LEASE, new_job, run_job_segments

SETTINGS = RenderSettings(output_ttl_s=3600.0, lease_s=2.0, janitor_interval_s=0.1, janitor_lease_s=60.0)


def test_the_holder_sweeps_expired_outputs_and_leftovers_and_close_gives_the_lease_up(tmp_path: Path) -> None:
    with temp_stores(tmp_path) as st:
        st.jobs.create_job(new_job("old", segments=1))
        run_job_segments(st.jobs, "old")
        join = st.jobs.claim("w", LONG_LEASE, 3)
        assert join is not None
        st.blobs.put(output_key("old"), b"mp4")
        assert st.jobs.complete_join(join, output_key("old"), 3, {}, "", 1e-6)  # expired at once
        st.jobs.create_job(new_job("failed"))
        st.jobs.fail_job("failed", "boom", 13)
        st.blobs.put("jobs/failed/upload", b"x")
        st.blobs.put("jobs/failed/segments/00001.mp4", b"x")
        metrics = Metrics("render")
        a, b = (Janitor(SETTINGS, metrics, st.jobs, st.blobs, name) for name in ("a", "b"))

        async def scenario() -> None:
            assert await a._hold() and not await b._hold()
            done = await a.sweep()
            assert (done.outputs, done.files, done.complete) == (1, 0, True)  # the failed job ended < lease_s ago
            await a.close()
            assert await b._hold()  # given up: the other takes it at once

        asyncio.run(scenario())
        assert st.jobs.lease_holder(JANITOR_LEASE) == "b"
        assert st.blob_keys() == ["jobs/failed/segments/00001.mp4", "jobs/failed/upload"]
        job = st.jobs.get_job("old")
        assert job.output_purge_time > 0
        assert metrics.retention_deleted.labels("output")._value.get() == 1
        with_grace_over = Janitor(
            RenderSettings(lease_s=0.001, janitor_interval_s=0.1, janitor_lease_s=60.0), metrics, st.jobs, st.blobs, "b"
        )
        assert asyncio.run(with_grace_over.sweep()).files == 2
        assert st.blob_keys() == []
