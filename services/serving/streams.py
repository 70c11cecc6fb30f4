"""Pipelined request/response streams: each request is processed concurrently, answers keep order.

A servicer reads its request stream in a background task and starts work on each message at once,
so several messages of one stream can sit in the same GPU batch; responses are yielded in request
order. At most `max_pending` items are in flight per stream: beyond that the reader stops reading,
and gRPC flow control pushes back on the client.

`byte_ranges` and `message_budget` are how the servicers cut the answer to one request message into
responses that fit: by bytes (half the message limit each), not by item count.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

Req = TypeVar("Req")
Resp = TypeVar("Resp")
_DONE = object()


def message_budget(max_message_bytes: int) -> int:
    """Bytes of items one response message may carry: half the configured message limit (the other
    half is headroom for field tags, lengths and ModelInfo), as the stage clients size their requests."""
    return max(1, max_message_bytes // 2)


def byte_ranges(sizes: Sequence[int], budget: int, overhead: int = 0) -> list[tuple[int, int]]:
    """Cut items of `sizes` bytes (each plus `overhead`) into consecutive [start, end) runs, in order,
    each at most `budget` bytes; an item larger than `budget` on its own is a run of one (it is never
    split, and it still fits when the message limit allows it). No items -> no runs.
    """
    ranges: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        size += overhead
        if i > start and total + size > budget:
            ranges.append((start, i))
            start, total = i, 0
        total += size
    if len(sizes) > start:
        ranges.append((start, len(sizes)))
    return ranges


def item_count(request: Any) -> int:
    """Default `size_of`: the length of a repeated `items` field (1 for other messages)."""
    items: Any = getattr(request, "items", None)
    try:
        return max(1, len(items))
    except TypeError:  # not a repeated field
        return 1


async def ordered_stream(
    requests: AsyncIterator[Req],
    handle: Callable[[Req], Awaitable[Resp | None]],
    max_pending: int = 512,
    size_of: Callable[[Req], int] = item_count,
) -> AsyncIterator[Resp]:
    """Yield `await handle(r)` for each request r, in order, with several handled concurrently.

    `handle` may return None for a message that needs no answer (e.g. one that only sets up state);
    it is called in request order, so state set by message k is visible to message k+1.
    """
    budget = asyncio.Semaphore(max_pending)
    order: asyncio.Queue[Any] = asyncio.Queue()

    async def reader() -> None:
        try:
            async for request in requests:
                n = min(max(1, size_of(request)), max_pending)
                for _ in range(n):
                    await budget.acquire()
                task = asyncio.ensure_future(handle(request))
                await order.put((task, n))
        except BaseException as exc:  # noqa: BLE001 - hand the failure to the writer side
            await order.put(exc)
            return
        await order.put(_DONE)

    reading = asyncio.create_task(reader())
    try:
        while True:
            entry = await order.get()
            if entry is _DONE:
                break
            if isinstance(entry, BaseException):
                raise entry
            task, n = entry
            try:
                response = await task
            finally:
                for _ in range(n):
                    budget.release()
            if response is not None:
                yield response
    finally:
        reading.cancel()
        # Cancel work that is still queued for a stream that failed or went away.
        while not order.empty():
            entry = order.get_nowait()
            if isinstance(entry, tuple):
                entry[0].cancel()
