"""Tests for services.serving.metrics: the exported names, registry isolation and the /metrics server."""

from __future__ import annotations

import urllib.request

from prometheus_client import generate_latest

from services.serving.metrics import Metrics, start_metrics_server

DESIGN_NAMES = [
    "lipline_stage_requests_total",
    "lipline_stage_items_total",
    "lipline_stage_queue_seconds",
    "lipline_stage_compute_seconds",
    "lipline_stage_batch_size",
    "lipline_stage_inflight_items",
    "lipline_stage_queue_depth",
    "lipline_backend_info",
    "lipline_jobs_total",
    "lipline_job_seconds",
    "lipline_job_realtime_factor",
    "lipline_render_first_frame_seconds",
]


def _observe_everything(m: Metrics) -> None:
    m.requests.labels(m.stage, "Extract", "OK").inc()
    m.request_seconds.labels(m.stage, "Extract").observe(0.1)
    m.items.labels(m.stage).inc(3)
    m.queue_seconds.labels(m.stage).observe(0.002)
    m.compute_seconds.labels(m.stage).observe(0.02)
    m.batch_size.labels(m.stage).observe(3)
    m.inflight.labels(m.stage).set(2)
    m.queue_depth.labels(m.stage).set(1)
    m.set_backend("wav2lip", "torch", "fp32")
    m.jobs.labels("succeeded").inc()
    m.job_seconds.observe(4.0)
    m.job_realtime_factor.observe(2.5)
    m.render_first_frame_seconds.observe(0.3)


def _sample_names(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_every_design_metric_is_exported() -> None:
    m = Metrics("x")
    _observe_everything(m)
    text = generate_latest(m.registry).decode()
    samples = _sample_names(text)
    for name in DESIGN_NAMES:
        assert f"# TYPE {name} " in text, name
        assert name in samples or f"{name}_count" in samples, name
    assert 'lipline_stage_requests_total{code="OK",method="Extract",stage="x"} 1.0' in text
    assert 'lipline_stage_items_total{stage="x"} 3.0' in text
    assert 'lipline_stage_batch_size_bucket{le="4.0",stage="x"} 1.0' in text
    assert 'lipline_jobs_total{status="succeeded"} 1.0' in text


def test_histogram_types_and_gauges() -> None:
    m = Metrics("x")
    _observe_everything(m)
    text = generate_latest(m.registry).decode()
    for name in (
        "lipline_stage_queue_seconds",
        "lipline_stage_compute_seconds",
        "lipline_stage_batch_size",
        "lipline_job_seconds",
        "lipline_job_realtime_factor",
        "lipline_render_first_frame_seconds",
    ):
        assert f"# TYPE {name} histogram" in text
    for name in ("lipline_stage_inflight_items", "lipline_stage_queue_depth", "lipline_backend_info"):
        assert f"# TYPE {name} gauge" in text
    assert m.registry.get_sample_value("lipline_stage_inflight_items", {"stage": "x"}) == 2
    assert m.registry.get_sample_value("lipline_job_seconds_count") == 1


def test_backend_info_carries_its_labels_and_is_replaced() -> None:
    m = Metrics("lipsync")
    m.set_backend("procedural", "cpu", "fp32")
    m.set_backend("wav2lip", "torch", "fp16")
    lines = [
        line for line in generate_latest(m.registry).decode().splitlines() if line.startswith("lipline_backend_info{")
    ]
    assert len(lines) == 1  # the previous backend is cleared
    line = lines[0]
    for label in (
        'stage="lipsync"',
        'model="wav2lip"',
        'backend="torch"',
        'precision="fp16"',
        "torch=",
        "cuda=",
        "cudnn=",
        "tensorrt=",
    ):
        assert label in line
    assert line.endswith(" 1.0")


def test_two_instances_do_not_collide() -> None:
    a, b = Metrics("audio"), Metrics("lipsync")  # would raise "Duplicated timeseries" on a shared registry
    a.items.labels(a.stage).inc(5)
    b.items.labels(b.stage).inc(1)
    assert a.registry is not b.registry
    assert a.registry.get_sample_value("lipline_stage_items_total", {"stage": "audio"}) == 5
    assert a.registry.get_sample_value("lipline_stage_items_total", {"stage": "lipsync"}) is None
    assert b.registry.get_sample_value("lipline_stage_items_total", {"stage": "lipsync"}) == 1
    Metrics("audio")  # same stage again, fresh registry: fine too


def test_no_ids_in_label_names() -> None:
    m = Metrics("x")
    _observe_everything(m)
    for family in m.registry.collect():
        for sample in family.samples:
            assert not any(label.endswith("id") for label in sample.labels), (family.name, sample.labels)


def test_metrics_server_serves_metrics_over_http() -> None:
    m = Metrics("http")
    m.items.labels(m.stage).inc(7)
    port = start_metrics_server(m, 0, host="127.0.0.1")
    assert 0 < port < 65536
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        body = response.read().decode()
    assert 'lipline_stage_items_total{stage="http"} 7.0' in body
    assert "# TYPE lipline_stage_queue_depth gauge" in body


def test_metrics_server_disabled_with_negative_port() -> None:
    assert start_metrics_server(Metrics("off"), -1) == -1


def test_the_audio_service_does_not_load_torch() -> None:
    # The audio image carries no torch use: labelling lipline_backend_info must not import it.
    import subprocess
    import sys

    code = (
        "import sys; from services.audio.service import AudioService; from services.serving.metrics import Metrics; "
        "Metrics('audio').set_backend('wav2lip-mel', 'cpu', 'fp32'); sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
