"""RenderTasks' upload rule: a task cancelled mid-upload (its lease went away) ends only after the upload
has, so the loop's clean-up of an ended job (RenderWorker._sweep_if_ended) comes after its last write."""

from __future__ import annotations

import asyncio
import threading
import types
from pathlib import Path

import pytest

from services.jobs.store.folder import FolderBlobStore
from services.render.tasks import RenderTasks


class SlowFolder(FolderBlobStore):
    """A real folder store whose uploads wait for the test's go (an upload in flight when the lease is lost)."""

    def __init__(self, root: Path) -> None:
        super().__init__(str(root))
        self.started, self.go = threading.Event(), threading.Event()

    def put_file(self, key: str, path: Path) -> None:
        self.started.set()
        self.go.wait(10)
        super().put_file(key, path)


def test_a_task_cancelled_mid_upload_ends_only_once_the_upload_has(tmp_path: Path) -> None:
    store = SlowFolder(tmp_path / "blobs")
    made = tmp_path / "segment.mp4"
    made.write_bytes(b"a segment")
    tasks = types.SimpleNamespace(blobs=store)  # _store uses only the blob store

    async def main() -> None:
        upload = asyncio.create_task(RenderTasks._store(tasks, "jobs/j1/segments/0.mp4", made))  # type: ignore[arg-type]
        await asyncio.to_thread(store.started.wait, 10)
        upload.cancel()  # the heartbeat lost the lease: the worker cancels the task
        await asyncio.sleep(0.05)
        assert not upload.done()  # still waiting for the upload's thread
        store.go.set()  # the upload's thread goes on and stores the file
        with pytest.raises(asyncio.CancelledError):
            await upload
        # Cancelled, and by then the file is stored (nothing lands later): deleting it is the loop's
        # call, which knows whether the job ended or another worker owns the key now.
        assert store.exists("jobs/j1/segments/0.mp4")

    asyncio.run(main())
