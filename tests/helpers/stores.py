"""A temporary SQLite job store and folder blob store, for tests that call store users directly."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

from services.jobs.store import open_blob_store, open_job_store
from services.jobs.store.blobs import BlobStore
from services.jobs.store.jobs import JobStore


@dataclasses.dataclass
class Stores:
    jobs: JobStore
    blobs: BlobStore
    root: Path

    def blob_keys(self) -> list[str]:
        """Every key in the blob store (the folder's files)."""
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())


@contextlib.contextmanager
def temp_stores(folder: Path) -> Iterator[Stores]:
    """A migrated SQLite job store and a folder blob store under ``folder``, closed afterwards."""
    jobs = open_job_store(f"sqlite:///{folder}/jobs.db")
    jobs.migrate()
    try:
        yield Stores(jobs, open_blob_store(str(folder / "blobs")), folder / "blobs")
    finally:
        jobs.close()
