"""Tests for services.serving.streams: ordered_stream (order, concurrency, back-pressure, errors) and
stream_call (a client-streaming call's failing request iterator, on a real grpc.aio server)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from services.serving.errors import TooLarge
from services.serving.streams import ordered_stream, stream_call


async def _aiter(items: list[Any], fail_after: int | None = None) -> AsyncIterator[Any]:
    for i, item in enumerate(items):
        if fail_after is not None and i == fail_after:
            raise ConnectionError("client went away")
        await asyncio.sleep(0)
        yield item


async def _collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


def _run(coro: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await asyncio.wait_for(coro, 5)

    return asyncio.run(main())


@dataclass
class Tracker:
    """Counts handles running at once and items accepted but not yet consumed."""

    running: int = 0
    max_running: int = 0
    outstanding: int = 0
    max_outstanding: int = 0
    started: list[Any] = field(default_factory=list)
    cancelled: list[Any] = field(default_factory=list)

    def wrap(self, work: Callable[[Any], Awaitable[Any]], weight: Callable[[Any], int] = lambda r: 1):
        async def handle(request: Any) -> Any:
            self.started.append(request)
            self.running += 1
            self.outstanding += weight(request)
            self.max_running = max(self.max_running, self.running)
            self.max_outstanding = max(self.max_outstanding, self.outstanding)
            try:
                return await work(request)
            except asyncio.CancelledError:
                self.cancelled.append(request)
                raise
            finally:
                self.running -= 1

        return handle


def test_order_is_kept_when_later_requests_finish_first() -> None:
    rng = random.Random(3)
    delays = {i: rng.uniform(0, 0.02) for i in range(40)}
    delays[0] = 0.05  # the first one is the slowest
    finished: list[int] = []
    tracker = Tracker()

    async def work(i: int) -> str:
        await asyncio.sleep(delays[i])
        finished.append(i)
        return f"r{i}"

    out = _run(_collect(ordered_stream(_aiter(list(range(40))), tracker.wrap(work), max_pending=64)))
    assert out == [f"r{i}" for i in range(40)]
    assert finished != sorted(finished)  # they really did complete out of order
    assert tracker.max_running > 1  # and concurrently


def test_requests_are_handled_concurrently() -> None:
    tracker = Tracker()

    async def work(i: int) -> int:
        await asyncio.sleep(0.05)
        return i

    async def main() -> tuple[list[int], float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        out = await _collect(ordered_stream(_aiter(list(range(20))), tracker.wrap(work), max_pending=32))
        return out, loop.time() - start

    out, took = _run(main())
    assert out == list(range(20))
    assert tracker.max_running == 20
    assert took < 0.5  # 20 x 50 ms one after the other would be 1 s


def test_handles_start_in_request_order() -> None:
    tracker = Tracker()

    async def work(i: int) -> int:
        await asyncio.sleep(random.random() * 0.005)
        return i

    _run(_collect(ordered_stream(_aiter(list(range(30))), tracker.wrap(work), max_pending=8)))
    assert tracker.started == list(range(30))


def test_back_pressure_bounds_items_in_flight() -> None:
    tracker = Tracker()
    max_pending = 4

    async def work(i: int) -> int:
        await asyncio.sleep(random.random() * 0.01)
        return i

    async def main() -> list[int]:
        out = []
        async for response in ordered_stream(_aiter(list(range(30))), tracker.wrap(work), max_pending=max_pending):
            tracker.outstanding -= 1
            out.append(response)
            await asyncio.sleep(0.002)  # a slow consumer
        return out

    assert _run(main()) == list(range(30))
    assert tracker.max_outstanding == max_pending  # reached, never exceeded


@dataclass
class Batch:
    items: list[int]


def test_back_pressure_counts_items_of_batched_requests() -> None:
    tracker = Tracker()
    max_pending = 6
    requests = [Batch([j] * n) for j, n in enumerate([2, 3, 1, 4, 2, 2, 3, 1, 6, 9])]

    async def work(request: Batch) -> Batch:
        await asyncio.sleep(random.random() * 0.01)
        return request

    async def main() -> list[Batch]:
        out = []
        stream = ordered_stream(
            _aiter(requests), tracker.wrap(work, lambda r: min(len(r.items), max_pending)), max_pending=max_pending
        )
        async for response in stream:
            tracker.outstanding -= min(len(response.items), max_pending)
            out.append(response)
            await asyncio.sleep(0.002)
        return out

    assert _run(main()) == requests  # a request bigger than max_pending still goes through
    assert tracker.max_outstanding <= max_pending


def test_none_results_are_skipped_and_state_flows_in_order() -> None:
    state: dict[str, Any] = {}

    async def handle(request: tuple[str, Any]) -> Any:
        kind, value = request
        if kind == "setup":
            state["prefix"] = value  # a message that only sets up state
            return None
        prefix = state["prefix"]  # read before the first await: the state as of this message
        await asyncio.sleep(0.001 * (5 - value))
        return f"{prefix}{value}"

    requests = [("setup", "a"), ("item", 1), ("item", 2), ("setup", "b"), ("item", 3)]
    out = _run(_collect(ordered_stream(_aiter(requests), handle)))
    assert out == ["a1", "a2", "b3"]


def test_empty_request_stream_yields_nothing() -> None:
    async def handle(request: Any) -> Any:
        raise AssertionError("never called")

    assert _run(_collect(ordered_stream(_aiter([]), handle))) == []


def test_handle_exception_propagates_and_cancels_the_rest() -> None:
    tracker = Tracker()

    async def work(i: int) -> int:
        if i == 2:
            await asyncio.sleep(0.02)
            raise ValueError("bad item 2")
        await asyncio.sleep(0 if i < 2 else 10)
        return i

    async def main() -> list[int]:
        got = []
        with pytest.raises(ValueError, match="bad item 2"):
            async for response in ordered_stream(_aiter(list(range(8))), tracker.wrap(work), max_pending=16):
                got.append(response)
        await asyncio.sleep(0.01)  # let the cancellations land
        assert tracker.running == 0
        return got

    assert _run(main()) == [0, 1]
    assert sorted(tracker.cancelled) == [3, 4, 5, 6, 7]


def test_failing_request_iterator_propagates_after_earlier_answers() -> None:
    async def handle(i: int) -> int:
        await asyncio.sleep(0.001)
        return i * 2

    async def main() -> list[int]:
        got = []
        with pytest.raises(ConnectionError, match="client went away"):
            async for response in ordered_stream(_aiter(list(range(10)), fail_after=3), handle):
                got.append(response)
        return got

    assert _run(main()) == [0, 2, 4]


def test_consumer_leaving_early_cancels_pending_work() -> None:
    tracker = Tracker()

    async def work(i: int) -> int:
        await asyncio.sleep(0 if i == 0 else 10)
        return i

    async def main() -> None:
        stream = ordered_stream(_aiter(list(range(5))), tracker.wrap(work), max_pending=16)
        assert await stream.__anext__() == 0
        await asyncio.sleep(0.01)
        await stream.aclose()
        await asyncio.sleep(0.01)
        assert tracker.running == 0

    _run(main())
    assert sorted(tracker.cancelled) == [1, 2, 3, 4]


# --------------------------------------------------------------------------------------------------
# stream_call: a client-streaming call whose request iterator fails, on a real grpc.aio server
# --------------------------------------------------------------------------------------------------

STREAMS = "lipline.test.Streams"


class Receiver:
    """Echo (stream-stream: each request back) and Total (stream-unary: the bytes received)."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()  # an Echo call's handler has ended (its client cancelled it)

    async def echo(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        try:
            async for request in requests:
                yield request
        finally:
            self.ended.set()

    async def total(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        return str(sum([len(r) async for r in requests])).encode()


@contextlib.asynccontextmanager
async def receiver() -> AsyncIterator[tuple[Receiver, Any, Any]]:
    """A Receiver on 127.0.0.1:0: (it, its Echo, its Total) as client multi-callables (raw bytes)."""
    handler = Receiver()
    server = grpc.aio.server()
    methods = {
        "Echo": grpc.stream_stream_rpc_method_handler(handler.echo),
        "Total": grpc.stream_unary_rpc_method_handler(handler.total),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(STREAMS, methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield handler, channel.stream_stream(f"/{STREAMS}/Echo"), channel.stream_unary(f"/{STREAMS}/Total")
    finally:
        await server.stop(0)


async def _failing(sent: list[bytes] | None = None) -> AsyncIterator[bytes]:
    """Two requests, then the failure a decoder meets at a limit."""
    for request in (b"one", b"two"):
        if sent is not None:
            sent.append(request)
        yield request
    raise TooLarge("the upload has more than 2 frames, the limit")


def test_grpc_alone_turns_a_failing_request_iterator_into_a_bare_cancel() -> None:
    """Why stream_call exists: gRPC keeps the exception to itself and cancels the call."""

    async def main() -> None:
        async with receiver() as (_, echo, total):
            with pytest.raises(asyncio.CancelledError):
                async for _ in echo(_failing(), timeout=30):
                    pass
            with pytest.raises(asyncio.CancelledError):
                await total(_failing(), timeout=30)

    _run(main())


def test_the_requests_exception_is_raised_where_the_responses_are_read() -> None:
    async def main() -> None:
        async with receiver() as (handler, echo, _):
            answers = []
            with pytest.raises(TooLarge, match="more than 2 frames"):
                async for answer in stream_call(echo, _failing(), timeout=30):
                    answers.append(answer)
            assert answers in ([], [b"one"], [b"one", b"two"])  # whatever came back before the failure
            await asyncio.wait_for(handler.ended.wait(), 10)  # and the call is ended at the server too

    _run(main())


def test_the_requests_exception_is_raised_where_the_single_response_is_awaited() -> None:
    async def main() -> None:
        async with receiver() as (_, echo, total):
            with pytest.raises(TooLarge, match="more than 2 frames"):
                await stream_call(total, _failing(), timeout=30)
            call = stream_call(echo, _failing(), timeout=30)
            with pytest.raises(TooLarge, match="more than 2 frames"):
                while True:
                    await call.read()

    _run(main())


def test_answers_pass_unchanged_and_the_requests_are_closed_after_the_call() -> None:
    closed = []

    async def requests() -> AsyncIterator[bytes]:
        try:
            yield b"abc"
            yield b"de"
        finally:
            closed.append(True)

    async def main() -> None:
        async with receiver() as (_, echo, total):
            assert [a async for a in stream_call(echo, [b"x", b"yz"], timeout=30)] == [b"x", b"yz"]
            assert await stream_call(total, requests(), timeout=30) == b"5"
            assert closed == [True]
            call = stream_call(echo, iter([b"k"]), timeout=30)
            assert [a async for a in call] == [b"k"]
            assert await call.code() == grpc.StatusCode.OK  # the rest is the call's own

    _run(main())


def test_a_cancel_of_the_awaiting_task_stays_a_cancel() -> None:
    closed = asyncio.Event()

    async def waiting() -> AsyncIterator[bytes]:
        try:
            yield b"one"
            await asyncio.Event().wait()  # never more requests
            yield b"never"
        finally:
            closed.set()

    async def main() -> None:
        async with receiver() as (_, echo, _total):
            reading = asyncio.create_task(_collect(stream_call(echo, waiting(), timeout=30)))
            await asyncio.sleep(0.2)
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
            await asyncio.wait_for(closed.wait(), 10)  # the requests' generator was closed with the call

    _run(main())


def _client_streaming_methods() -> set[str]:
    """The names of every RPC whose requests are a stream, from the protos' descriptors."""
    import importlib

    names = set()
    for module in ("audio", "gateway", "lipsync", "live", "session", "superres"):
        descriptor = importlib.import_module(f"lipline.v1.{module}_pb2").DESCRIPTOR
        for service in descriptor.services_by_name.values():
            names |= {m.name for m in service.methods if m.client_streaming}
    return names


def test_every_request_iterator_handed_to_grpc_goes_through_stream_call() -> None:
    """The class of issue 29: a stub method of a client-streaming RPC called with a request iterator
    (not through stream_call in services/, the client package's helpers in clients/python) swallows
    the iterator's exception. Calls without one (reader/writer style: `stub.Converse()` then
    `write`) write their requests themselves and are allowed."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    methods = _client_streaming_methods()
    assert {"CreateAvatar", "Converse", "DetectFaces", "Generate", "Upscale", "Extract"} <= methods
    found = []
    for folder in ("services", "clients/python/src"):
        for path in sorted((root / folder).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in methods
                    and node.args
                ):
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.func.attr}(...)")
    assert found == [], "pass these requests through services.serving.streams.stream_call"
