"""Tests for services.inference.batcher.DynamicBatcher: merging, limits, delays, order, errors, metrics."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from services.inference.batcher import DynamicBatcher
from services.serving.metrics import Metrics

STAGE = "test"


class FakeModel:
    """A run_batch that records every batch it gets and answers item * 10 (or raises for 'bad')."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.batches: list[list[Any]] = []
        self.threads: set[str] = set()
        self.delay_s = delay_s
        self._lock = threading.Lock()

    def __call__(self, items: list[Any]) -> list[Any]:
        with self._lock:
            self.batches.append(list(items))
            self.threads.add(threading.current_thread().name)
        if self.delay_s:
            time.sleep(self.delay_s)
        if "bad" in items:
            raise ValueError("model exploded")
        return [item * 10 for item in items]

    @property
    def sizes(self) -> list[int]:
        return [len(b) for b in self.batches]


def _run(
    body: Callable[[DynamicBatcher, FakeModel, Metrics], Awaitable[None]],
    model: FakeModel | None = None,
    **kwargs: Any,
) -> tuple[FakeModel, Metrics]:
    model = model or FakeModel()
    metrics = Metrics(STAGE)

    async def main() -> None:
        batcher: DynamicBatcher = DynamicBatcher(model, metrics, **kwargs)
        batcher.start()
        try:
            await asyncio.wait_for(body(batcher, model, metrics), 5)
        finally:
            await batcher.close()

    asyncio.run(main())
    return model, metrics


def _sample(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"stage": STAGE})


def test_concurrent_callers_share_one_batch() -> None:
    async def body(batcher: DynamicBatcher, model: FakeModel, _m: Metrics) -> None:
        a, b, c = await asyncio.gather(
            batcher.submit_many([1, 2, 3, 4, 5]), batcher.submit_many([11, 12, 13]), batcher.submit(21)
        )
        assert a == [10, 20, 30, 40, 50]
        assert b == [110, 120, 130]
        assert c == 210

    model, _ = _run(body, max_batch=32, max_delay_s=0.05)
    assert model.sizes == [9]
    assert sorted(model.batches[0]) == [1, 2, 3, 4, 5, 11, 12, 13, 21]


def test_batches_never_exceed_max_batch_and_order_is_kept() -> None:
    async def body(batcher: DynamicBatcher, _model: FakeModel, _m: Metrics) -> None:
        assert await batcher.submit_many(list(range(10))) == [i * 10 for i in range(10)]

    model, _ = _run(body, max_batch=4, max_delay_s=0.05)
    assert model.sizes == [4, 4, 2]
    assert [x for b in model.batches for x in b] == list(range(10))


def test_lone_item_is_dispatched_after_max_delay() -> None:
    delay = 0.1

    async def body(batcher: DynamicBatcher, _model: FakeModel, _m: Metrics) -> None:
        start = time.perf_counter()
        assert await batcher.submit(7) == 70
        waited = time.perf_counter() - start
        assert delay * 0.8 <= waited < delay + 1.0

    model, _ = _run(body, max_batch=8, max_delay_s=delay)
    assert model.sizes == [1]


def test_full_batch_does_not_wait_for_the_delay() -> None:
    async def body(batcher: DynamicBatcher, _model: FakeModel, _m: Metrics) -> None:
        start = time.perf_counter()
        assert await batcher.submit_many([1, 2, 3, 4]) == [10, 20, 30, 40]
        assert time.perf_counter() - start < 2.0  # far below max_delay_s

    model, _ = _run(body, max_batch=4, max_delay_s=30.0)
    assert model.sizes == [4]


def test_late_item_joins_a_waiting_batch() -> None:
    async def body(batcher: DynamicBatcher, _model: FakeModel, _m: Metrics) -> None:
        first = asyncio.create_task(batcher.submit(1))
        await asyncio.sleep(0.02)
        assert await batcher.submit(2) == 20
        assert await first == 10

    model, _ = _run(body, max_batch=8, max_delay_s=0.3)
    assert model.sizes == [2]


def test_order_is_preserved_per_caller_across_many_batches() -> None:
    callers = [[c * 100 + i for i in range(n)] for c, n in enumerate([7, 1, 12, 5, 9, 3])]

    async def body(batcher: DynamicBatcher, _model: FakeModel, _m: Metrics) -> None:
        async def call(items: list[int]) -> list[int]:
            await asyncio.sleep(0.001 * (items[0] % 7))
            return await batcher.submit_many(items)

        results = await asyncio.gather(*(call(items) for items in callers))
        for items, result in zip(callers, results):
            assert result == [x * 10 for x in items]

    model, _ = _run(body, max_batch=5, max_delay_s=0.005)
    assert max(model.sizes) <= 5
    assert sum(model.sizes) == sum(map(len, callers))


def test_model_runs_off_the_event_loop_thread() -> None:
    async def body(batcher: DynamicBatcher, _model: FakeModel, _m: Metrics) -> None:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        task = asyncio.create_task(ticker())
        await batcher.submit(1)  # the fake model sleeps 0.2 s in its thread
        task.cancel()
        assert ticks >= 5  # the loop kept running while the model computed

    model, _ = _run(body, model=FakeModel(delay_s=0.2), max_batch=4, max_delay_s=0.0)
    assert model.threads and threading.main_thread().name not in model.threads
    assert all(name.startswith(f"{STAGE}-model") for name in model.threads)


def test_a_failing_item_fails_only_its_caller_and_the_loop_lives_on() -> None:
    async def body(batcher: DynamicBatcher, _model: FakeModel, _m: Metrics) -> None:
        # Same batch: the batch fails, its items are run again one by one, only "bad" fails.
        bad, innocent = await asyncio.gather(batcher.submit("bad"), batcher.submit(1), return_exceptions=True)
        assert isinstance(bad, ValueError) and str(bad) == "model exploded"
        assert innocent == 10
        # A caller whose items span the failing item gets the error; the other caller its outputs.
        failed, fine = await asyncio.gather(
            batcher.submit_many(["bad", 2]), batcher.submit_many([3, 4]), return_exceptions=True
        )
        assert isinstance(failed, ValueError)
        assert fine == [30, 40]
        # And the batcher keeps serving.
        assert await batcher.submit_many([5, 6, 7]) == [50, 60, 70]

    model, metrics = _run(body, max_batch=2, max_delay_s=0.05)
    # The failed batch ["bad", 1] is retried item by item; so is ["bad", 2].
    assert model.batches[:7] == [["bad", 1], ["bad"], [1], ["bad", 2], ["bad"], [2], [3, 4]]
    assert _sample(metrics, "lipline_stage_items_total") == 7  # 1, 2, 3, 4, 5, 6, 7: failed calls are not counted
    assert _sample(metrics, "lipline_stage_batch_size_count") == 9  # every model call is
    assert _sample(metrics, "lipline_stage_inflight_items") == 0


def test_wrong_number_of_outputs_is_an_error_for_the_callers() -> None:
    def short(items: list[int]) -> list[int]:
        return items[:-1]

    async def main() -> None:
        batcher: DynamicBatcher = DynamicBatcher(short, Metrics(STAGE), max_batch=4, max_delay_s=0.0)
        batcher.start()
        try:
            with pytest.raises(RuntimeError, match="returned 0 outputs for 1 items"):
                await asyncio.wait_for(batcher.submit_many([1, 2]), 5)
        finally:
            await batcher.close()

    asyncio.run(main())


def test_caller_that_went_away_is_dropped_from_the_batch() -> None:
    async def body(batcher: DynamicBatcher, _model: FakeModel, _m: Metrics) -> None:
        gone = asyncio.create_task(batcher.submit(1))
        await asyncio.sleep(0.01)
        gone.cancel()
        await asyncio.sleep(0.01)
        assert await batcher.submit(2) == 20

    model, _ = _run(body, max_batch=8, max_delay_s=0.1)
    assert model.batches == [[2]]


def test_metrics_move() -> None:
    async def body(batcher: DynamicBatcher, _model: FakeModel, metrics: Metrics) -> None:
        assert await batcher.submit_many(list(range(10))) == [i * 10 for i in range(10)]
        assert await batcher.submit(3) == 30

    _, metrics = _run(body, max_batch=4, max_delay_s=0.01)
    assert _sample(metrics, "lipline_stage_batch_size_count") == 4  # 4 + 4 + 2, then 1
    assert _sample(metrics, "lipline_stage_batch_size_sum") == 11
    assert _sample(metrics, "lipline_stage_items_total") == 11
    assert _sample(metrics, "lipline_stage_queue_seconds_count") == 11
    assert _sample(metrics, "lipline_stage_compute_seconds_count") == 4
    assert _sample(metrics, "lipline_stage_inflight_items") == 0
    assert _sample(metrics, "lipline_stage_queue_depth") == 0


def test_inflight_counts_items_while_waiting() -> None:
    seen: list[float | None] = []

    async def body(batcher: DynamicBatcher, _model: FakeModel, metrics: Metrics) -> None:
        task = asyncio.create_task(batcher.submit_many([1, 2, 3]))
        await asyncio.sleep(0.02)
        seen.append(_sample(metrics, "lipline_stage_inflight_items"))
        await task

    _run(body, max_batch=8, max_delay_s=0.1)
    assert seen == [3]


def test_submit_before_start_is_an_error() -> None:
    async def main() -> None:
        batcher: DynamicBatcher = DynamicBatcher(FakeModel(), Metrics(STAGE))
        with pytest.raises(RuntimeError, match="not started"):
            await batcher.submit(1)
        await batcher.close()

    asyncio.run(main())


def test_bounded_queue_makes_submit_wait() -> None:
    release = threading.Event()

    def slow(items: Sequence[int]) -> list[int]:
        release.wait(5)
        return [i * 10 for i in items]

    async def main() -> None:
        batcher: DynamicBatcher = DynamicBatcher(slow, Metrics(STAGE), max_batch=1, max_delay_s=0.0, max_queue=2)
        batcher.start()
        try:
            first = asyncio.create_task(batcher.submit(0))  # taken by the loop, blocks in the model
            await asyncio.sleep(0.02)
            filler = asyncio.create_task(batcher.submit_many([1, 2]))  # fills the queue
            await asyncio.sleep(0.02)
            blocked = asyncio.create_task(batcher.submit(3))
            await asyncio.sleep(0.05)
            assert not blocked.done()
            assert batcher._queue.qsize() == 2
            release.set()
            assert await asyncio.wait_for(asyncio.gather(first, filler, blocked), 5) == [0, [10, 20], 30]
        finally:
            release.set()
            await batcher.close()

    asyncio.run(main())


def test_chunks_fill_batches_by_rows_and_are_never_split() -> None:
    """With size_of, a queued item is a chunk of rows: batches close at max_batch rows."""
    from services.inference.batcher import DynamicBatcher
    from services.serving.metrics import Metrics

    seen: list[list[int]] = []

    def run_batch(chunks: list[list[int]]) -> list[int]:
        seen.append([len(c) for c in chunks])
        return [sum(c) for c in chunks]

    async def main() -> list[int]:
        batcher = DynamicBatcher(run_batch, Metrics("chunks"), max_batch=8, max_delay_s=0.05, size_of=len)
        batcher.start()
        try:
            return await batcher.submit_many([[1] * 5, [2] * 2, [3] * 3, [4] * 8])
        finally:
            await batcher.close()

    import asyncio

    assert asyncio.run(main()) == [5, 4, 9, 32]
    assert seen == [[5, 2], [3], [8]]


def test_concurrency_runs_batches_in_parallel() -> None:
    """With concurrency=2 the next batch starts while the previous one is still in the model."""
    import asyncio

    from services.inference.batcher import DynamicBatcher
    from services.serving.metrics import Metrics
    from tests.helpers.occupancy import Occupancy

    occupancy = Occupancy()

    def run_batch(items: list[int]) -> list[int]:
        with occupancy.inside(0.2):
            return [i * 2 for i in items]

    async def main(concurrency: int) -> list[int]:
        batcher = DynamicBatcher(
            run_batch, Metrics(f"c{concurrency}"), max_batch=2, max_delay_s=0.001, concurrency=concurrency
        )
        batcher.start()
        try:
            return list(await asyncio.gather(*(batcher.submit(i) for i in range(6))))
        finally:
            await batcher.close()

    assert asyncio.run(main(1)) == [0, 2, 4, 6, 8, 10] and occupancy.peak == 1
    occupancy.peak = 0
    assert asyncio.run(main(2)) == [0, 2, 4, 6, 8, 10] and occupancy.peak == 2
