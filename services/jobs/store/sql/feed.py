"""The waiting half of a job store's change feed, shared by SQLite (polling) and PostgreSQL (LISTEN)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

from services.jobs.store.jobs import ChangeFeed
from services.serving.background import cancel_and_wait

if TYPE_CHECKING:
    from services.jobs.store.sql.store import SqlJobStore

NOTIFY_CHANNEL = "lipline_jobs"  # PostgreSQL's NOTIFY channel; the payload is the job id


@dataclasses.dataclass(eq=False)
class _Waiter:
    after_version: int
    woken: asyncio.Future


class WaiterFeed(ChangeFeed):
    """The waiting half of a feed: coroutines park on futures (no threads); a subclass's `_run` task
    (polling, or LISTEN) wakes them. Starting and closing that task is the same for both stores."""

    def __init__(self, store: SqlJobStore) -> None:
        self._store = store
        self._waiters: dict[str, set[_Waiter]] = {}
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"lipline-{type(self).__name__}")

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self._wake_all()

    async def wait(self, job_id: str, after_version: int, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        waiter = _Waiter(after_version, loop.create_future())
        # Registered before the version is read: a change after the read wakes the future.
        self._waiters.setdefault(job_id, set()).add(waiter)
        try:
            if await asyncio.to_thread(self._store.job_version, job_id) > after_version:
                return
            remaining = deadline - loop.time()
            if remaining > 0:
                await asyncio.wait([waiter.woken], timeout=remaining)
        finally:
            waiters = self._waiters.get(job_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[job_id]

    def _watched(self) -> list[str]:
        return list(self._waiters)

    def _wake(self, job_id: str, version: int | None = None) -> None:
        """Wake the job's waiters (only those below `version` when it is known)."""
        for waiter in self._waiters.get(job_id, ()):
            if not waiter.woken.done() and (version is None or version > waiter.after_version):
                waiter.woken.set_result(None)

    def _wake_all(self) -> None:
        for job_id in list(self._waiters):
            self._wake(job_id)
