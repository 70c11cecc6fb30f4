"""A temporary SQLite job store and folder blob store, for tests that call store users directly."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
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


def race_processes(script: str, args: list[list[str]], timeout_s: float = 60.0) -> list[tuple[int, str, str]]:
    """Runs `python -c script *a` for each `a` of `args` at once, lets them go together (each waits for a
    line on stdin first, so start-up times do not serialise them), and returns (returncode, stdout,
    stderr) of each: the store tests' way of racing real processes on one store."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *a],
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for a in args
    ]
    try:
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]
