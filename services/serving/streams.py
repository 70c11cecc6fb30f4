"""Pipelined request/response streams: each request is processed concurrently, answers keep order.

A servicer reads its request stream in a background task and starts work on each message at once,
so several messages of one stream can sit in the same GPU batch; responses are yielded in request
order. At most `max_pending` items are in flight per stream: beyond that the reader stops reading,
and gRPC flow control pushes back on the client.

`byte_ranges` and `message_budget` are how the servicers cut the answer to one request message into
responses that fit: by bytes (half the message limit each), not by item count.

`stream_call` is the client side's: every request iterator lipline hands to a client-streaming call
goes through it, so that an exception raised while producing the requests (a limit met while
decoding an upload, a failed upstream stream) reaches the code awaiting the responses.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Sequence
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


class StreamCall:
    """A client-streaming call (stream-unary or stream-stream) made by `stream_call`: awaiting it,
    iterating it or `read()` raise its requests' own exception where gRPC would end them with the
    CancelledError it caused; everything else (`cancel()`, `code()`, ...) is the call's."""

    def __init__(self, call: Any, failures: list[Exception]) -> None:
        self._call = call
        self._failures = failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

    def __await__(self) -> Any:
        return self._response().__await__()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._responses()

    async def read(self) -> Any:
        async with self._raising():
            return await self._call.read()

    async def _response(self) -> Any:
        async with self._raising():
            return await self._call

    async def _responses(self) -> AsyncIterator[Any]:
        async with self._raising():
            async for response in self._call:
                yield response

    @contextlib.asynccontextmanager
    async def _raising(self) -> AsyncIterator[None]:
        try:
            yield
            if self._failures:  # the call ended before its requests failed (a race): they still failed
                raise self._failures[0]
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._failures or (task is not None and task.cancelling()):
                raise  # no request failed, or the task awaiting the call is cancelled: a cancel
            raise self._failures[0] from None
        except Exception:  # the call's end (its status) is a consequence of the requests' failure
            if not self._failures:
                raise
            raise self._failures[0] from None


def stream_call(method: Callable[..., Any], requests: AsyncIterable[Any] | Iterable[Any], **kwargs: Any) -> StreamCall:
    """`method(requests, **kwargs)`, a client-streaming grpc.aio stub method, such that an exception
    `requests` raise is raised where the call's answer is awaited.

    grpc.aio reads a call's request iterator in a task of its own: an exception there is logged at
    DEBUG and only cancels the call. The code awaiting the responses then sees a bare CancelledError,
    which, escaping a server's handler, reads as the client's own cancel: no status is sent and the
    client waits until its deadline (a CreateAvatar whose upload met a limit while decoding did).
    Here the exception is kept as the iterator raises it (which still ends the call), and the
    StreamCall raises it instead, so the caller's own error handling, and a server's error
    interceptor, give it its status. A cancel of the task awaiting the call stays a cancel.
    Every request iterator lipline hands to a grpc.aio call goes through this.
    """
    failures: list[Exception] = []

    async def watched() -> AsyncIterator[Any]:
        try:
            if isinstance(requests, AsyncIterable):
                async for request in requests:
                    yield request
            else:
                for request in requests:
                    yield request
        except Exception as exc:  # CancelledError and GeneratorExit are the call's end, not a failure
            failures.append(exc)
            raise
        finally:
            close = getattr(requests, "aclose", None)
            if close is not None:  # an async generator left at a yield: run its finally blocks now
                await close()

    return StreamCall(method(watched(), **kwargs), failures)
