"""A live worker's side of session placement: its row in the job store, its sessions' leases.

The job store holds every live session's row (tenant, avatar, worker, state, lease), so any gateway
routes a Converse or a resume to the worker that holds the session, and a worker that dies loses its
leases: a resume then lands on another worker (the gateway's OpenSession with `resume`). This module
calls the store's session API (services/jobs/store: `heartbeat_live_worker`, `remove_live_worker`,
`lease_session`, `renew_session_leases`, `end_session`) and nothing else.

Releasing on drain: the API has no release; renewing a lease for 0 s makes it expire now, which is
what a release is (another worker's `lease_session` takes an expired lease at once).

A job store without the session tables (a lipline before them) makes placement a no-op, logged once
at start: the worker then holds what the gateway opens on it, and nobody else can find it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Iterable
from typing import Any

from services.serving.errors import FailedPrecondition

_LOGGER = logging.getLogger(__name__)
SESSION_API = ("heartbeat_live_worker", "remove_live_worker", "lease_session", "renew_session_leases", "end_session")


async def _call(method: Any, *args: Any) -> Any:
    """The store's method, awaited when it is a coroutine function, else run in a thread (it blocks)."""
    if inspect.iscoroutinefunction(method):
        return await method(*args)
    return await asyncio.to_thread(method, *args)


class Placement:
    """This worker's row and its sessions' leases in the job store."""

    def __init__(self, jobs: Any, worker_id: str, address: str, capacity: int, lease_s: float) -> None:
        self.jobs = jobs
        self.worker_id = worker_id
        self.address = address
        self.capacity = capacity
        self.lease_s = lease_s
        missing = [name for name in SESSION_API if not callable(getattr(jobs, name, None))]
        self.enabled = not missing
        if missing:
            _LOGGER.warning("the job store has no live session API (%s): sessions are not placed through it", ", ".join(missing))

    async def lease(self, session_id: str) -> None:
        """Takes the session's lease; FailedPrecondition when another live worker holds it."""
        if self.enabled and not await _call(self.jobs.lease_session, session_id, self.worker_id, self.lease_s):
            raise FailedPrecondition(f"session {session_id} is held by another live worker; resume it through the gateway")

    async def beat(self, session_ids: Iterable[str], active: int, draining: bool) -> set[str]:
        """Upserts this worker's row and renews the leases; returns the sessions whose lease is no longer ours."""
        ids = list(session_ids)
        if not self.enabled:
            return set()
        await _call(self.jobs.heartbeat_live_worker, self.worker_id, self.address, self.capacity, active, draining)
        if not ids:
            return set()
        kept = await _call(self.jobs.renew_session_leases, self.worker_id, ids, self.lease_s)
        return set(ids) - set(kept)

    async def end(self, session_id: str, state: str, error: str, error_code: int) -> None:
        """Marks the session ended (CLOSED or FAILED) in the store, if it is still ours."""
        if self.enabled:
            await _call(self.jobs.end_session, session_id, self.worker_id, state, error, error_code)

    async def release(self, session_ids: Iterable[str]) -> None:
        """Lets the sessions go (their leases expire now): a resume lands on another worker at once."""
        ids = list(session_ids)
        if self.enabled and ids:
            await _call(self.jobs.renew_session_leases, self.worker_id, ids, 0.0)

    async def remove(self) -> None:
        """Deletes this worker's row (on exit)."""
        if self.enabled:
            await _call(self.jobs.remove_live_worker, self.worker_id)
