"""A live worker's side of session placement: its row in the job store, its sessions' leases.

The job store holds every live session's row (tenant, avatar, worker, state, lease:
services/jobs/store/sessions.py), so any gateway routes a Converse or a resume to the worker that
holds the session, and a worker that dies loses its leases: a resume then lands on another worker
(the gateway's OpenSession with `resume`). This module is the worker's use of that contract: its
heartbeat row (address, capacity, active, draining), a lease per session it holds (taken at
OpenSession, renewed with every heartbeat: a session whose renewal fails is no longer ours and
ends here), the session's end (CLOSED or FAILED, with why), and on drain its leases released, so
a resume is placed on another worker at once rather than after the lease runs out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from services.jobs.store.sessions import SessionState, SessionStore
from services.serving.errors import FailedPrecondition

_LOGGER = logging.getLogger(__name__)


class Placement:
    """This worker's row and its sessions' leases in the job store."""

    def __init__(self, store: SessionStore, worker_id: str, address: str, capacity: int, lease_s: float) -> None:
        self.store = store
        self.worker_id = worker_id
        self.address = address
        self.capacity = capacity
        self.lease_s = lease_s

    async def lease(self, session_id: str) -> None:
        """Takes the session's lease; FailedPrecondition when another live worker holds it, or it ended."""
        if not await self.store.lease_session(session_id, self.worker_id, self.lease_s):
            raise FailedPrecondition(
                f"session {session_id} has ended or is held by another live worker; resume it through the gateway"
            )

    async def beat(self, session_ids: Iterable[str], active: int, draining: bool) -> set[str]:
        """Upserts this worker's row and renews the leases; returns the sessions whose lease is no longer ours."""
        ids = list(session_ids)
        await self.store.heartbeat_live_worker(self.worker_id, self.address, self.capacity, active, draining)
        if not ids:
            return set()
        kept = await self.store.renew_session_leases(self.worker_id, ids, self.lease_s)
        return set(ids) - set(kept)

    async def end(self, session_id: str, state: SessionState, error: str, error_code: int) -> None:
        """Marks the session ended (CLOSED or FAILED) in the store, if it is still ours."""
        await self.store.end_session(session_id, self.worker_id, state, error, error_code)

    async def release(self, session_ids: Iterable[str]) -> None:
        """Lets the sessions go: another worker may lease them at once (a resume lands there)."""
        await asyncio.gather(*(self.store.release_session(session_id, self.worker_id) for session_id in session_ids))

    async def remove(self) -> None:
        """Deletes this worker's row (on exit): no gateway places a session here any more."""
        await self.store.remove_live_worker(self.worker_id)
