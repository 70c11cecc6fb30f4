"""The two stores every stateful part of lipline goes through (docs/architecture.md sections 1 and 7).

- `jobs.JobStore`: the system of record for jobs, their tasks (segments and the join), leases and
  avatars' summaries. SQLite (embedded default) or PostgreSQL (a cluster); `open_job_store(url)`.
- `blobs.BlobStore`: uploads, avatars, segment files and outputs. A local folder (default; in
  Kubernetes a ReadWriteMany volume) or S3; `open_blob_store(url)`.
"""

from __future__ import annotations

import asyncio
import contextlib

from services.serving.settings import StoreSettings
from services.jobs.store.blobs import BlobStore, open_blob_store
from services.jobs.store.jobs import JobStore, open_job_store


async def open_stores(settings: StoreSettings) -> tuple[JobStore, BlobStore]:
    """The stores a gateway or render worker uses; the job store's schema created or migrated."""
    jobs = open_job_store(settings.job_store)
    await asyncio.to_thread(jobs.migrate)
    return jobs, open_blob_store(settings.blob_store)


def close_stores(jobs: JobStore | None, blobs: BlobStore | None) -> None:
    """Release both (either may be None when start-up failed before opening it)."""
    for store in (jobs, blobs):
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
