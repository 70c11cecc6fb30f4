"""Dynamic batching: items from all concurrent streams of a service are merged into model batches.

Like Triton's dynamic batcher: a batch is dispatched when it reaches `max_batch` items or when the
oldest waiting item has waited `max_delay_s`. The model runs in a worker thread (torch releases the
GIL), so the event loop keeps reading and writing streams while the GPU or CPU computes. The queue
is bounded: when it is full, `submit` waits, which pushes back through gRPC flow control to callers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from services.serving.metrics import Metrics

_LOGGER = logging.getLogger(__name__)
In = TypeVar("In")
Out = TypeVar("Out")


@dataclass
class _Pending(Generic[In]):
    item: In
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


class DynamicBatcher(Generic[In, Out]):
    """Runs `run_batch(items) -> outputs` (same length, same order) over merged batches.

    Args:
        run_batch: the model call; runs in a dedicated thread, one batch at a time.
        max_batch: largest batch handed to `run_batch`.
        max_delay_s: how long the first item of a batch may wait for company.
        max_queue: items allowed to wait; `submit` blocks beyond it (back-pressure).
        size_of: how many model rows an item stands for (default 1). A stage can queue a whole
            request message as one item (a chunk of rows): chunks are never split, and a batch is
            closed once its rows reach `max_batch`. This keeps per-row Python work out of the hot path.
        concurrency: batches handed to `run_batch` at once, each on its own thread (default 1). With
            2, the next batch is collected, uploaded and prepared while the previous one computes;
            `run_batch` must then be thread-safe.
    """

    def __init__(
        self,
        run_batch: Callable[[list[In]], Sequence[Out]],
        metrics: Metrics,
        max_batch: int = 32,
        max_delay_s: float = 0.005,
        max_queue: int = 4096,
        size_of: Callable[[In], int] | None = None,
        concurrency: int = 1,
    ) -> None:
        self._run_batch = run_batch
        self._size_of = size_of or (lambda _item: 1)
        self._metrics = metrics
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self._queue: asyncio.Queue[_Pending[In]] = asyncio.Queue(maxsize=max_queue)
        self.concurrency = max(1, concurrency)
        self._executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix=f"{metrics.stage}-model")
        self._task: asyncio.Task | None = None
        self._held: _Pending[In] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"{self._metrics.stage}-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._executor.shutdown(wait=True)

    async def submit(self, item: In) -> Out:
        """Queue one item and wait for its output."""
        (result,) = await self.submit_many([item])
        return result

    async def submit_many(self, items: Sequence[In]) -> list[Out]:
        """Queue several items (they may land in different batches) and wait for all outputs, in order."""
        if self._task is None:
            raise RuntimeError("batcher not started")
        loop = asyncio.get_running_loop()
        pendings = [_Pending(item, loop.create_future()) for item in items]
        m = self._metrics
        for p in pendings:
            await self._queue.put(p)
        rows = sum(self._size_of(p.item) for p in pendings)
        m.inflight.labels(m.stage).inc(rows)
        m.queue_depth.labels(m.stage).set(self._queue.qsize())
        try:
            return list(await asyncio.gather(*(p.future for p in pendings)))
        finally:
            m.inflight.labels(m.stage).dec(rows)

    async def _loop(self) -> None:
        slots = asyncio.Semaphore(self.concurrency)
        running: set[asyncio.Task] = set()

        def finished(task: asyncio.Task) -> None:
            running.discard(task)
            slots.release()

        try:
            while True:
                await slots.acquire()  # at most `concurrency` batches in the model at once
                try:
                    batch = await self._collect()
                except BaseException:
                    slots.release()
                    raise
                if not batch:
                    slots.release()
                    continue
                task = asyncio.create_task(self._dispatch(batch))
                running.add(task)
                task.add_done_callback(finished)
        finally:
            for task in running:
                task.cancel()

    async def _collect(self) -> list[_Pending[In]]:
        """Wait for the next batch: until it holds max_batch rows or its first item waited max_delay."""
        first = self._held or await self._queue.get()
        self._held = None
        batch = [first]
        rows = self._size_of(first.item)
        deadline = first.enqueued + self.max_delay_s
        while rows < self.max_batch:
            try:
                nxt = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                try:
                    nxt = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            size = self._size_of(nxt.item)
            if rows + size > self.max_batch:
                self._held = nxt  # starts the next batch; chunks are never split
                break
            batch.append(nxt)
            rows += size
        return [p for p in batch if not p.future.done()]  # callers that went away

    async def _dispatch(self, batch: list[_Pending[In]]) -> None:
        """Run one batch on a model thread and hand each caller its output (or its own error).

        A batch mixes items of every stream, so one item that fails the model call (a size the
        device cannot allocate, a value the model rejects) must not fail the others: when a batch
        of several items fails, each item is run again on its own and only the ones that still fail
        get an error. That costs one extra pass per item, only on the rare failed batch.
        """
        loop = asyncio.get_running_loop()
        m, stage = self._metrics, self._metrics.stage
        now = time.perf_counter()
        for p in batch:
            m.queue_seconds.labels(stage).observe(now - p.enqueued)
        m.queue_depth.labels(stage).set(self._queue.qsize())
        try:
            outputs = await self._run(loop, batch)
        except Exception as exc:  # noqa: BLE001 - isolate the culprit; the loop lives on
            if len(batch) == 1:
                _LOGGER.warning("item failed: %s", exc)
                _fail(batch[0], exc)
                return
            _LOGGER.warning("batch of %d failed (%s); running its items one by one", len(batch), exc)
            for p in batch:
                if p.future.done():
                    continue
                try:
                    (out,) = await self._run(loop, [p])
                except Exception as item_exc:  # noqa: BLE001 - only this caller gets the error
                    _LOGGER.warning("item failed: %s", item_exc)
                    _fail(p, item_exc)
                else:
                    if not p.future.done():
                        p.future.set_result(out)
            return
        m.compute_seconds.labels(stage).observe(time.perf_counter() - now)
        for p, out in zip(batch, outputs):
            if not p.future.done():
                p.future.set_result(out)

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending[In]]) -> Sequence[Out]:
        """One model call on the executor; counts the batch's size and, when it succeeds, its items."""
        m, stage = self._metrics, self._metrics.stage
        rows = sum(self._size_of(p.item) for p in batch)
        m.batch_size.labels(stage).observe(rows)
        outputs = await loop.run_in_executor(self._executor, self._run_batch, [p.item for p in batch])
        if len(outputs) != len(batch):
            raise RuntimeError(f"run_batch returned {len(outputs)} outputs for {len(batch)} items")
        m.items.labels(stage).inc(rows)
        return outputs


def _fail(pending: _Pending, exc: BaseException) -> None:
    if not pending.future.done():
        pending.future.set_exception(exc)
