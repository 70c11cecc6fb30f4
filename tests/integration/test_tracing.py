"""One job's trace, across real processes: the gateway and render workers export OTLP over gRPC to a
collector run by this test (the OTLP TraceService, spans kept in memory), and the tree is checked.

What a job's trace holds: the client's SubmitJob (gateway server span) at the root; under it every
task of the job, on whichever worker ran it (`render segment`, `render audio`, `render join`), each
with the stage calls it made (lipsync's Generate under a segment); and `lipline job`, the span of the
whole job from SubmitJob to its end, recorded by the worker that finished it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from lipline.v1 import gateway_pb2
from services.gateway.client import LiplineClient
from tests.integration.util import SAMPLES, cut_wav, eventually, start_cluster


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[dict] = []
        self._lock = threading.Lock()

    def Export(self, request, context):
        with self._lock:
            for resource_spans in request.resource_spans:
                service = next(
                    (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), ""
                )
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.spans.append(
                            {
                                "service": service,
                                "name": span.name,
                                "trace": span.trace_id.hex(),
                                "id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "attributes": {a.key: a.value for a in span.attributes},
                            }
                        )
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[Collector, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(4))
    servicer = Collector()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(0)


def test_a_job_is_one_trace(collector: tuple[Collector, int], tmp_path: Path) -> None:
    spans, port = collector
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within 0.1 s instead of 5 s
    }
    with start_cluster(tmp_path, env=env, extra_args={"gateway": ["--segment-seconds=0.8"]}) as cluster:
        with LiplineClient(cluster.gateway_address, timeout=120) as client:
            avatar = client.create_avatar((SAMPLES / "avatar.jpg").read_bytes(), name="traced")
            job = client.submit_job(avatar.id, cut_wav((SAMPLES / "speech.wav").read_bytes(), 2.0))
            done = client.wait(job.id)
            assert done.state == gateway_pb2.JOB_STATE_SUCCEEDED, done.error

            def job_span() -> dict | None:
                return next((s for s in spans.spans if s["name"] == "lipline job"), None)

            eventually(lambda: job_span() is not None, timeout=20, what="the job span to be exported")
            time.sleep(0.5)  # the last task spans end just before it

    whole = job_span()
    assert whole["attributes"]["lipline.job_id"].string_value == job.id
    assert whole["attributes"]["lipline.state"].string_value == "succeeded"
    trace = [s for s in spans.spans if s["trace"] == whole["trace"]]
    by_id = {s["id"]: s for s in trace}
    (submit,) = [s for s in trace if s["name"] == "gateway/SubmitJob" and s["service"] == "lipline-gateway"]
    assert whole["parent"] == submit["id"]
    tasks = [s for s in trace if s["name"].startswith("render ")]
    kinds = sorted(s["name"] for s in tasks)
    segments = sum(1 for k in kinds if k == "render segment")
    assert segments == math.ceil(done.total_frames / 20) and "render audio" in kinds and "render join" in kinds, kinds
    for task in tasks:  # every task, on any worker, is a child of the submit and inside the job's span
        assert task["parent"] == submit["id"]
        assert task["attributes"]["lipline.job_id"].string_value == job.id
        assert whole["start"] <= task["start"] <= whole["end"]
        if task["name"] != "render join":  # the job's span is recorded as its join completes, inside it
            assert task["end"] <= whole["end"]
    generates = [s for s in trace if s["name"] == "lipsync/Generate" and s["service"] == "lipline-lipsync"]
    assert len(generates) == segments
    assert all(by_id[g["parent"]]["name"] == "render segment" for g in generates)
