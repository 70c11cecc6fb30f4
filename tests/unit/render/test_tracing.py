"""A render task's span: named after the task, carrying the job id, parent of the stage calls' context."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.serving import tracing


def test_job_span_carries_the_job_and_is_the_parent_of_outgoing_calls() -> None:
    exporter = InMemorySpanExporter()
    assert tracing.configure_tracing("lipline-render", environ={}, exporter=exporter)
    try:
        with tracing.job_span("render segment", "job42", task=3, frames=50) as span:
            metadata = dict(tracing.outgoing_metadata("job42"))
            trace_id = span.get_span_context().trace_id
        (finished,) = exporter.get_finished_spans()
        assert finished.name == "render segment"
        assert dict(finished.attributes) == {"lipline.job_id": "job42", "lipline.task": 3, "lipline.frames": 50}
        # The stage calls made inside the span carry its context (W3C traceparent) and the request id.
        assert metadata["x-request-id"] == "job42"
        assert metadata["traceparent"].split("-")[1] == f"{trace_id:032x}"
    finally:
        tracing._ENABLED = False
        trace._TRACER_PROVIDER = None
        trace._TRACER_PROVIDER_SET_ONCE._done = False
