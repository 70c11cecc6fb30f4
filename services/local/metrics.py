"""A local process's Prometheus /metrics, read straight from its metrics port (the tests and the benches
of the local cluster; the chart's own scraping is a real Prometheus, `prometheus.py`)."""

from __future__ import annotations

import dataclasses
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def scrape(port: int, timeout: float = 5.0) -> list[Sample]:
    """Every sample the process exports now."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout).read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def metric_value(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels` (0 where there are none yet)."""
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


@dataclasses.dataclass(frozen=True)
class StageBatches:
    """A model stage's batch counters so far (`lipline_stage_*`, services/serving/metrics.py); the
    difference of two is what the stage did between them."""

    batches: float = 0.0
    items: float = 0.0
    compute_s: float = 0.0
    queue_s: float = 0.0  # summed over items
    queued_items: float = 0.0

    @classmethod
    def read(cls, samples: list[Sample]) -> StageBatches:
        return cls(
            batches=metric_value(samples, "lipline_stage_batch_size_count"),
            items=metric_value(samples, "lipline_stage_batch_size_sum"),
            compute_s=metric_value(samples, "lipline_stage_compute_seconds_sum"),
            queue_s=metric_value(samples, "lipline_stage_queue_seconds_sum"),
            queued_items=metric_value(samples, "lipline_stage_queue_seconds_count"),
        )

    def since(self, before: StageBatches, seconds: float) -> dict[str, float]:
        """What the stage did since `before`, over `seconds`: batches/s, items/s, the mean batch, model
        ms per batch, the share of the time the model ran (its batches' compute time / wall time) and the
        mean wait of an item for its batch."""
        batches = self.batches - before.batches
        items = self.items - before.items
        compute = self.compute_s - before.compute_s
        queued = self.queued_items - before.queued_items
        return {
            "batches_per_s": round(batches / seconds, 1),
            "items_per_s": round(items / seconds, 1),
            "mean_batch": round(items / batches, 2) if batches else 0.0,
            "compute_ms_per_batch": round(1000 * compute / batches, 2) if batches else 0.0,
            "compute_share": round(compute / seconds, 3),
            "queue_ms_per_item": round(1000 * (self.queue_s - before.queue_s) / queued, 2) if queued else 0.0,
        }
