"""Opt-in OpenTelemetry tracing: spans per RPC, context carried in gRPC metadata.

Enabled only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_TRACES_EXPORTER`) is set, configured by the
standard `OTEL_*` variables; otherwise every function here is a cheap no-op.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import Status, StatusCode

_LOGGER = logging.getLogger(__name__)
_ENABLED = False


def configure_tracing(service_name: str) -> bool:
    """Install an OTLP exporter if the standard variables ask for one; returns whether tracing is on."""
    global _ENABLED  # one process, one tracer provider: that is OpenTelemetry's own model
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_TRACES_EXPORTER")):
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)}))
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp") == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _ENABLED = True
    _LOGGER.info("tracing enabled")
    return True


@contextlib.contextmanager
def server_span(name: str, metadata: Mapping[str, Any]) -> Iterator[Any]:
    if not _ENABLED:
        yield None
        return
    ctx = propagate.extract(dict(metadata))
    with trace.get_tracer("lipline").start_as_current_span(name, context=ctx, kind=trace.SpanKind.SERVER) as span:
        yield span


def outgoing_metadata(request_id: str = "") -> list[tuple[str, str]]:
    """Metadata for a call to another stage: the request id and, when tracing, the trace context."""
    carrier: dict[str, str] = {}
    if _ENABLED:
        propagate.inject(carrier)
    if request_id:
        carrier["x-request-id"] = request_id
    return list(carrier.items())


def set_status(span: Any, code: grpc.StatusCode) -> None:
    if span is not None:
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code is not grpc.StatusCode.OK:
            span.set_status(Status(StatusCode.ERROR, code.name))
