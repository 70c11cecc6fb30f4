"""The two stores every stateful part of lipline goes through (docs/architecture.md sections 1 and 7).

- `jobs.JobStore`: the system of record for jobs, their tasks (segments and the join), leases and
  avatars' summaries. SQLite (embedded default) or PostgreSQL (a cluster); `open_job_store(url)`.
- `blobs.BlobStore`: uploads, avatars, segment files and outputs. A local folder (default; in
  Kubernetes a ReadWriteMany volume) or S3; `open_blob_store(url)`.

The factories live here, not in the interface modules: `jobs.py` and `blobs.py` import no
implementation, so each implementation imports its interface and nothing imports back. The
implementations are imported when a URL asks for them (psycopg and obstore load only when used).
"""

from __future__ import annotations

import asyncio
import contextlib

from services.jobs.store.blobs import BlobStore
from services.jobs.store.jobs import JobStore
from services.serving.settings import StoreSettings


def open_job_store(url: str) -> JobStore:
    """`sqlite:///relative/path.db`, `sqlite:////abs/path.db` or `postgresql://user:pw@host:port/db`."""
    if url.startswith("sqlite:"):
        from services.jobs.store.sqlite import SqliteJobStore

        return SqliteJobStore(url)
    if url.startswith(("postgresql:", "postgres:")):
        from services.jobs.store.postgres import PostgresJobStore

        return PostgresJobStore(url)
    raise ValueError(f"job store URL {url!r}: use sqlite:///path.db or postgresql://user:password@host:port/db")


def open_blob_store(url: str) -> BlobStore:
    """`file:///abs/folder`, a plain folder path, or `s3://bucket/optional/prefix` (credentials,
    region and endpoint from the standard AWS_* environment variables, e.g. AWS_ENDPOINT_URL)."""
    if url.startswith("s3://"):
        from services.jobs.store.s3 import S3BlobStore

        return S3BlobStore(url)
    from services.jobs.store.folder import FolderBlobStore

    return FolderBlobStore(url)


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
