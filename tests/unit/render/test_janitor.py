"""Tests for services.render.janitor on a temporary store: only the lease's holder sweeps, a sweep
deletes expired outputs and ended jobs' leftover files (and counts them), and close gives the
lease up. The lease's race and its expiry are the store's (tests/unit/jobs/store/test_retention.py);
two real workers and a kill are tests/integration/test_retention.py."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from services.jobs.layout import output_key
from services.render.janitor import JANITOR_LEASE, Janitor
from services.render.settings import RenderSettings
from services.serving.metrics import Metrics
from tests.helpers.stores import temp_stores
from tests.unit.jobs.store.test_jobs import LONG_LEASE, avatar, new_job, run_job_segments

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


def test_files_no_row_refers_to_are_deleted_once_nobody_has_written_them_for_a_while(tmp_path: Path) -> None:
    """A gateway killed between storing a job's (or an avatar's) files and writing its row leaves files
    nothing refers to: deleted once quiet for `unreferenced_after_s`; an upload in progress (recent
    writes), a job or avatar that has its row, and outputs stay. The pass runs every
    `unreferenced_after_s / 4`, not every round."""
    with temp_stores(tmp_path) as st:
        st.jobs.create_job(new_job("recorded"))
        st.jobs.put_avatar(avatar("a" * 24))
        lost_avatar = f"avatars/{'b' * 24}/source"
        lost_job = {"jobs/lost/upload", "jobs/lost/mels/00001.f16", "jobs/lost/segments/00001.mp4"}
        kept = {
            "jobs/recorded/upload",
            f"avatars/{'a' * 24}/meta.json",
            "outputs/gone.mp4",  # outputs are not listed (a job's output is written while its row exists)
        }
        for key in {lost_avatar, *lost_job, *kept}:
            st.blobs.put(key, b"x")
        hour_ago = time.time() - 3600

        def age(keys: set[str]) -> None:
            for key in keys:
                os.utime(st.root / key, (hour_ago, hour_ago))

        age({lost_avatar, *kept, *lost_job} - {"jobs/lost/segments/00001.mp4"})  # one file still being written
        metrics = Metrics("render")
        settings = RenderSettings(janitor_interval_s=0.1, janitor_lease_s=60.0, unreferenced_after_s=8.0)
        janitor = Janitor(settings, metrics, st.jobs, st.blobs, "a")
        assert asyncio.run(janitor.sweep()).unreferenced == 1  # the avatar's; the job's folder waits
        assert set(st.blob_keys()) == kept | lost_job
        assert metrics.retention_deleted.labels("unreferenced")._value.get() == 1
        age(lost_job)
        assert asyncio.run(janitor.sweep()).unreferenced == 0  # not due yet: every 2 s here
        time.sleep(2.1)
        assert asyncio.run(janitor.sweep()).unreferenced == 3
        assert set(st.blob_keys()) == kept
