"""The avatar janitor: purges the data of deleted avatars once no QUEUED or RUNNING job uses them,
and forgets request ids older than the idempotency window (no repeat can find them any more).

DeleteAvatar only marks an avatar deleted (it disappears for its tenant at once), so a job that was
already submitted keeps reading its frames and finishes. Its blobs and row go when the last such
job has ended: at once in DeleteAvatar when no job uses it, else at the janitor's next round.

Every gateway replica runs a janitor; purging is idempotent (deleting a prefix twice, or a row
another replica removed, does nothing), so replicas need no coordination. Blobs go before the row:
a gateway that dies between the two leaves a row the next round finds again, never orphan blobs.
"""

from __future__ import annotations

import asyncio
import logging

from services.jobs.avatars import prefix
from services.jobs.store.blobs import BlobStore
from services.jobs.store.jobs import JobStore
from services.serving.background import cancel_and_wait

_LOGGER = logging.getLogger(__name__)
PURGE_BATCH = 100  # avatars per round: a backlog is worked off over a few rounds


def purge_deleted_avatars(jobs: JobStore, blobs: BlobStore, avatar_id: str | None = None) -> list[str]:
    """Purge the deleted avatars no active job uses (only `avatar_id` when given); their ids."""
    purged = []
    for aid in jobs.purgeable_avatars(PURGE_BATCH, avatar_id):
        blobs.delete_prefix(prefix(aid))
        jobs.forget_avatar(aid)
        purged.append(aid)
    return purged


class AvatarJanitor:
    """A task on the gateway's event loop: `purge_deleted_avatars` every `interval_s` seconds, and
    the request ids older than `request_window_s`."""

    def __init__(self, jobs: JobStore, blobs: BlobStore, interval_s: float, request_window_s: float) -> None:
        self._jobs, self._blobs, self._interval_s = jobs, blobs, interval_s
        self._request_window_s = request_window_s
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="lipline-avatar-janitor")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                purged = await asyncio.to_thread(purge_deleted_avatars, self._jobs, self._blobs)
                await asyncio.to_thread(self._jobs.purge_requests, self._request_window_s)
            except Exception as exc:  # noqa: BLE001 - a store that is down now: the next round retries
                _LOGGER.warning(
                    "avatar janitor: purging deleted avatars or old request ids failed (%s: %s); retrying in %.0f s",
                    type(exc).__name__,
                    exc,
                    self._interval_s,
                )
                continue
            if purged:
                _LOGGER.info("avatar janitor: purged deleted avatars", extra={"avatars": purged})

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
