"""What operators rely on: health, reflection, /metrics, and a graceful drain on SIGTERM."""

from __future__ import annotations

import queue
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from lipline.v1 import audio_pb2, gateway_pb2, lipsync_pb2, superres_pb2, superres_pb2_grpc
from services.gateway.client import LiplineClient
from services.local.cluster import LocalCluster, started_stages
from services.media.wire import image_from_proto, image_to_proto
from tests.helpers.audio_files import encode_tone
from tests.integration.util import health_status, logs_of

SERVICE_NAMES = {
    "gateway": gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name,
    "audio": audio_pb2.DESCRIPTOR.services_by_name["AudioService"].full_name,
    "lipsync": lipsync_pb2.DESCRIPTOR.services_by_name["LipSyncService"].full_name,
    "superres": superres_pb2.DESCRIPTOR.services_by_name["SuperResService"].full_name,
}
ALL = ["gateway", *started_stages()]  # the conftest cluster: optional stages are not started
WORKERS = ["render", "render-1"]


def scrape(cluster: LocalCluster, name: str) -> str:
    port = cluster.processes[name].metrics_port
    assert port > 0, f"{name} has no metrics port"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def sample_sum(text: str, sample: str, **labels: str) -> float:
    """Sum of the samples called `sample` whose labels include `labels` (0.0 when there are none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def family_names(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


# --------------------------------------------------------------------------------------------------
# Health and reflection
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_health_serving(cluster: LocalCluster, name: str) -> None:
    address = cluster.processes[name].address
    assert health_status(address) == health_pb2.HealthCheckResponse.SERVING
    assert health_status(address, SERVICE_NAMES[name]) == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as err:
        health_status(address, "no.such.Service")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("name", ALL)
def test_reflection_lists_services(cluster: LocalCluster, name: str) -> None:
    with grpc.insecure_channel(cluster.processes[name].address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAMES[name]),
        ]
        listed, described = list(stub.ServerReflectionInfo(iter(requests), timeout=10))
    services = {s.name for s in listed.list_services_response.service}
    assert {SERVICE_NAMES[name], "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services
    assert described.file_descriptor_response.file_descriptor_proto, "no descriptor for the service"


# --------------------------------------------------------------------------------------------------
# /metrics
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_metrics_endpoint(cluster: LocalCluster, name: str) -> None:
    text = scrape(cluster, name)
    names = family_names(text)
    assert {"lipline_stage_requests", "lipline_backend_info", "lipline_stage_items"} <= names
    assert "lipline_stage_requests_total" in text
    if name != "gateway":  # the gateway runs no model
        assert sample_sum(text, "lipline_backend_info", stage=name) == 1.0, text


def test_metrics_after_a_job(cluster: LocalCluster, client: LiplineClient, avatar_bytes: bytes) -> None:
    before = {name: scrape(cluster, name) for name in ALL + WORKERS}
    avatar = client.create_avatar(avatar_bytes)
    job = client.wait(
        client.submit_job(avatar.id, encode_tone("wav", 1.0, rate=16000, channels=1), super_resolution=True).id
    )
    assert job.state == gateway_pb2.JOB_STATE_SUCCEEDED, job.error
    after = {name: scrape(cluster, name) for name in ALL + WORKERS}

    def grew(name: str, sample: str, by: float = 1.0, **labels: str) -> None:
        delta = sample_sum(after[name], sample, **labels) - sample_sum(before[name], sample, **labels)
        assert delta >= by, (name, sample, labels, delta)

    assert sample_sum(after["lipsync"], "lipline_stage_items_total", stage="lipsync") > 0
    grew("lipsync", "lipline_stage_items_total", by=job.total_frames, stage="lipsync")
    grew("audio", "lipline_stage_items_total", by=job.total_frames, stage="audio")
    grew("superres", "lipline_stage_items_total", by=job.total_frames, stage="superres")

    def workers_grew(sample: str, by: float = 1.0, **labels: str) -> None:
        """Summed over the render workers: which one finished which part is up to their claims."""
        delta = sum(sample_sum(after[w], sample, **labels) - sample_sum(before[w], sample, **labels) for w in WORKERS)
        assert delta >= by, (sample, labels, delta)

    workers_grew("lipline_jobs_total", status="succeeded")
    workers_grew("lipline_job_seconds_count")
    workers_grew("lipline_render_frames_total", by=job.total_frames)
    workers_grew("lipline_segments_total", by=2, status="done")  # at least one segment and the join
    workers_grew("lipline_render_encode_seconds_count", by=job.total_frames)
    grew("gateway", "lipline_stage_requests_total", stage="gateway", method="SubmitJob", code="OK")
    grew("audio", "lipline_stage_requests_total", stage="audio", method="Extract", code="OK")
    grew("lipsync", "lipline_stage_requests_total", stage="lipsync", method="Generate", code="OK")
    grew("superres", "lipline_stage_requests_total", stage="superres", method="Upscale", code="OK")
    assert sample_sum(after["lipsync"], "lipline_stage_batch_size_count", stage="lipsync") > 0


# --------------------------------------------------------------------------------------------------
# SIGTERM: drain in-flight streams, refuse new work, exit 0
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def lone_superres(tmp_path: Path) -> Iterator[LocalCluster]:
    """Just a superres process, started exactly as LocalCluster starts every service."""
    c = LocalCluster(tmp_path)
    try:
        c._start("superres", [])
        c._wait_ready("superres")
        yield c
    finally:
        c.stop()


def _request(i: int) -> superres_pb2.UpscaleRequest:
    face = np.full((96, 96, 3), i * 20 % 256, np.uint8)
    return superres_pb2.UpscaleRequest(
        items=[superres_pb2.UpscaleItem(index=i, image=image_to_proto(face), out_width=128, out_height=128)]
    )


def _wait_for_log(proc, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in proc.log():
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{proc.log()[-4000:]}"
        time.sleep(0.02)


@pytest.mark.slow
def test_sigterm_drains_in_flight_stream(lone_superres: LocalCluster) -> None:
    proc = lone_superres.processes["superres"]
    outbox: queue.Queue[superres_pb2.UpscaleRequest | None] = queue.Queue()

    def requests() -> Iterator[superres_pb2.UpscaleRequest]:  # consumed by gRPC's sender thread
        while (request := outbox.get(timeout=30)) is not None:
            yield request

    with grpc.insecure_channel(proc.address) as channel:
        call = superres_pb2_grpc.SuperResServiceStub(channel).Upscale(requests(), timeout=60)
        received = []
        for i in range(4):
            outbox.put(_request(i))
            received.append(next(call))

        proc.process.send_signal(signal.SIGTERM)
        _wait_for_log(proc, "draining in-flight RPCs", timeout=10)

        # New work is refused while the old stream drains: health says NOT_SERVING, or (once the
        # listener is closed, a moment after the log line) a new connection fails UNAVAILABLE. A call
        # that lands in the few ms between the two can see CANCELLED from gRPC core instead, so
        # give the server a moment first.
        time.sleep(0.3)
        try:
            status = health_status(proc.address, timeout=2)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
        else:
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        with grpc.insecure_channel(proc.address) as fresh:
            with pytest.raises(grpc.RpcError) as err:
                list(superres_pb2_grpc.SuperResServiceStub(fresh).Upscale(iter([_request(99)]), timeout=5))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        assert proc.process.poll() is None, "exited before the in-flight stream finished"

        # The in-flight stream keeps going: send the rest, close the request side, read everything.
        for i in range(4, 10):
            outbox.put(_request(i))
        outbox.put(None)
        received.extend(call)
        assert call.code() == grpc.StatusCode.OK, call.details()

    assert [item.index for r in received for item in r.items] == list(range(10))
    for r in received:
        for item in r.items:
            face = image_from_proto(item.image)
            assert face.shape == (128, 128, 3) and int(face[64, 64, 0]) == item.index * 20 % 256
    assert proc.process.wait(timeout=15) == 0, logs_of(lone_superres)
    assert "stopped" in proc.log()
