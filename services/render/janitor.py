"""The render workers' janitor (issue 21 item 6): deletes expired outputs and the working files
(`jobs/<id>/`: upload, mel windows, AAC track, segments) that ended jobs left behind.

Every render worker runs one, but only the holder of the job store's lease `JANITOR_LEASE` sweeps:
each round (every `janitor_interval_s`) a worker takes or renews the lease (services.jobs.store's
named leases: the task leases' rule, "expired or mine", without a task), so one worker stays the
janitor while it lives, and another takes over `janitor_lease_s` after it stops renewing (killed,
partitioned). A sweep renews the lease between batches and stops when it cannot, so a janitor that
stalled past its lease never sweeps beside its successor. Sweeping is idempotent all the same
(deleting a missing blob does nothing; rows are marked after their blobs are deleted), so a holder
killed mid-sweep leaves nothing the next holder does not redo.

Jobs delete their working files themselves when they end (the join, a failed task, CancelJob); the
janitor's pass over ended jobs is what makes that certain when one of those deletes was lost (a
worker killed between ending its job and deleting, a blob store that was down). Each ended job is
visited once (`files_purge_time`), after the task lease (`lease_s`), by when a worker that lost its
lease has stopped writing segments.

Files no row refers to are the last pass: SubmitJob and CreateAvatar store their files before the row
that records them, so a gateway killed in between (or an avatar upload cancelled while its row was being
written) leaves `jobs/<id>/` or `avatars/<id>/` with no job or avatar. The pass lists those folders
with their write times and deletes the ones whose id has no row and whose newest file is older than
`unreferenced_after_s` (an hour by default, far longer than any upload takes, so an upload in progress,
whose row comes right after its last write, is never touched). It lists every working file and every
avatar's, so it runs every `unreferenced_after_s / 4`, not every round. Outputs are not listed (a
week of them can be most of the store): a job's output is written only while its row exists, and a
worker whose late upload outlived the row deletes it (services.render.worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence

from services.jobs.avatars import prefix as avatar_prefix
from services.jobs.layout import job_prefix, output_key
from services.jobs.store.blobs import BlobStore
from services.jobs.store.jobs import JobStore
from services.render.settings import RenderSettings
from services.serving.background import cancel_and_wait
from services.serving.metrics import Metrics

_LOGGER = logging.getLogger(__name__)
JANITOR_LEASE = "render-janitor"
SWEEP_BATCH = 100  # jobs per batch; the lease is renewed between batches


@dataclasses.dataclass
class Sweep:
    """What one sweep did."""

    stamped: int = 0  # succeeded jobs that had no expiry and were given one
    outputs: int = 0  # expired outputs deleted
    files: int = 0  # working files of ended jobs deleted (left behind: their job's own delete was lost)
    unreferenced: int = 0  # files of jobs and avatars that have no row (their gateway died before writing it)
    complete: bool = True  # False: the lease was lost mid-sweep and the sweep stopped


class Janitor:
    """A task on the render worker's event loop (see the module docstring)."""

    def __init__(self, settings: RenderSettings, metrics: Metrics, jobs: JobStore, blobs: BlobStore, name: str) -> None:
        self._s, self._metrics, self._jobs, self._blobs, self.name = settings, metrics, jobs, blobs, name
        self._task: asyncio.Task | None = None
        self._next_unreferenced = 0.0  # monotonic time of the next pass over files no row refers to

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="render-janitor")

    async def _run(self) -> None:
        while True:
            try:
                if await self._hold():
                    done = await self.sweep()
                    if done.stamped or done.outputs or done.files or done.unreferenced:
                        _LOGGER.info("janitor swept", extra={"worker": self.name, **dataclasses.asdict(done)})
            except Exception as exc:  # noqa: BLE001 - a store that is down now: the next round retries
                _LOGGER.warning(
                    "janitor: a sweep failed (%s: %s); retrying in %.0f s",
                    type(exc).__name__,
                    exc,
                    self._s.janitor_interval_s,
                    extra={"worker": self.name},
                )
            await asyncio.sleep(self._s.janitor_interval_s)

    async def _hold(self) -> bool:
        """Take or renew the janitor's lease; whether this worker holds it now."""
        return await asyncio.to_thread(self._jobs.take_lease, JANITOR_LEASE, self.name, self._s.janitor_lease_s)

    async def sweep(self) -> Sweep:
        """One sweep, by the lease's holder: stamp missing expiries, delete expired outputs, then the
        working files of ended jobs, batch by batch while the lease holds."""
        s, jobs, blobs, m = self._s, self._jobs, self._blobs, self._metrics
        done = Sweep()
        if s.output_ttl_s > 0:
            done.stamped = await asyncio.to_thread(jobs.stamp_output_expiry, s.output_ttl_s)
        while expired := await asyncio.to_thread(jobs.expired_outputs, SWEEP_BATCH):
            for job_id, stored_key in expired:
                for key in dict.fromkeys((output_key(job_id), stored_key or output_key(job_id))):
                    with contextlib.suppress(ValueError):  # a damaged key: the layout's is deleted all the same
                        await asyncio.to_thread(blobs.delete, key)
                if await asyncio.to_thread(jobs.mark_output_purged, job_id):
                    done.outputs += 1
                    m.retention_deleted.labels("output").inc()
            if not await self._hold():
                done.complete = False
                return done
        while ended := await asyncio.to_thread(jobs.unpurged_job_files, s.lease_s, SWEEP_BATCH):
            for job_id in ended:
                deleted = await asyncio.to_thread(blobs.delete_prefix, job_prefix(job_id))
                done.files += deleted
                m.retention_deleted.labels("files").inc(deleted)
            await asyncio.to_thread(jobs.mark_files_purged, ended)
            if not await self._hold():
                done.complete = False
                return done
        if time.monotonic() >= self._next_unreferenced:
            self._next_unreferenced = time.monotonic() + s.unreferenced_after_s / 4
            done.unreferenced = await self._sweep_unreferenced()
        return done

    async def _sweep_unreferenced(self) -> int:
        """Delete what no row refers to (the module docstring): returns how many files."""
        jobs, blobs = self._jobs, self._blobs

        def known_jobs(ids: Sequence[str]) -> set[str]:
            return set(jobs.job_versions(ids))

        deleted = 0
        for top, known, folder in (("jobs/", known_jobs, job_prefix), ("avatars/", jobs.known_avatars, avatar_prefix)):
            newest: dict[str, float] = {}
            for key, written in (await asyncio.to_thread(blobs.modified_times, top)).items():
                oid, sep, _ = key[len(top) :].partition("/")
                if sep:  # a file in an id's folder (anything else there is not ours to judge)
                    newest[oid] = max(newest.get(oid, 0.0), written)
            cutoff = time.time() - self._s.unreferenced_after_s
            quiet = [oid for oid, written in newest.items() if written < cutoff]
            recorded = await asyncio.to_thread(known, quiet) if quiet else set()
            for oid in (oid for oid in quiet if oid not in recorded):
                gone = await asyncio.to_thread(blobs.delete_prefix, folder(oid))
                deleted += gone
                self._metrics.retention_deleted.labels("unreferenced").inc(gone)
                _LOGGER.warning(
                    "janitor: deleted files that no row refers to",
                    extra={"worker": self.name, "prefix": f"{top}{oid}", "files": gone},
                )
        return deleted

    async def close(self) -> None:
        """Stop, and give the lease up so another worker can be the janitor at its next round."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        try:
            await asyncio.to_thread(self._jobs.drop_lease, JANITOR_LEASE, self.name)
        except Exception as exc:  # noqa: BLE001 - the lease then expires by itself
            _LOGGER.warning("janitor: could not give its lease up (%s); it expires by itself", exc)
