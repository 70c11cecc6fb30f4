"""Reading a process's /metrics over HTTP (services/local/metrics.py): a stage's batch counters, and
what it did between two reads."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from services.local.metrics import StageBatches, metric_value, scrape
from services.serving.metrics import Metrics


@pytest.fixture
def served() -> Iterator[tuple[Metrics, int]]:
    registry = CollectorRegistry()
    metrics = Metrics("lipsync", registry)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield metrics, server.server_port
    finally:
        server.shutdown()
        thread.join(5)


def batch(metrics: Metrics, size: int, compute_s: float, wait_s: float) -> None:
    metrics.batch_size.labels("lipsync").observe(size)
    metrics.compute_seconds.labels("lipsync").observe(compute_s)
    for _ in range(size):
        metrics.queue_seconds.labels("lipsync").observe(wait_s)


def test_what_a_stage_did_between_two_reads(served: tuple[Metrics, int]) -> None:
    metrics, port = served
    batch(metrics, 32, 0.08, 0.5)  # before the window: not counted
    before = StageBatches.read(scrape(port))
    batch(metrics, 4, 0.02, 0.01)
    batch(metrics, 12, 0.04, 0.03)
    done = StageBatches.read(scrape(port)).since(before, seconds=2.0)
    assert done == {
        "batches_per_s": 1.0,
        "items_per_s": 8.0,
        "mean_batch": 8.0,
        "compute_ms_per_batch": 30.0,
        "compute_share": 0.03,
        "queue_ms_per_item": 25.0,  # (4 x 10 + 12 x 30) / 16
    }


def test_a_metric_missing_so_far_reads_zero(served: tuple[Metrics, int]) -> None:
    metrics, port = served
    samples = scrape(port)
    assert metric_value(samples, "lipline_stage_batch_size_count") == 0.0
    assert StageBatches.read(samples).since(StageBatches(), seconds=1.0)["mean_batch"] == 0.0
    metrics.items.labels("lipsync").inc(3)
    assert metric_value(scrape(port), "lipline_stage_items_total", stage="lipsync") == 3.0
    assert metric_value(scrape(port), "lipline_stage_items_total", stage="superres") == 0.0
