"""Stopping a process's background asyncio tasks (change feeds, janitors, pollers) the one way."""

from __future__ import annotations

import asyncio
import contextlib


async def cancel_and_wait(task: asyncio.Task[object] | None) -> None:
    """Cancels ``task`` (None: nothing to stop) and waits until it has ended, so that nothing it
    holds outlives the close that stopped it; its cancellation is not an error of the caller's."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
