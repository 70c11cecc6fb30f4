"""Opt-in OpenTelemetry tracing: spans per RPC, context carried in gRPC metadata.

Configured by the standard `OTEL_*` variables, read the way the SDK documents them:
- `OTEL_SDK_DISABLED=true` turns everything off;
- `OTEL_TRACES_EXPORTER`: `none` (off), `console`, or `otlp`; unset means `otlp` when
  `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set, else off;
- `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL`: `grpc` (default) or
  `http/protobuf`; the exporters read their endpoint, headers and timeouts themselves;
- `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER(_ARG)`: read by the SDK.
When off, every function here is a cheap no-op.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import Status, StatusCode

_LOGGER = logging.getLogger(__name__)
_ENABLED = False


EXPORTERS = ("otlp-grpc", "otlp-http", "console")


def choose_exporter(environ: Mapping[str, str]) -> str | None:
    """Which span exporter the standard variables ask for: one of EXPORTERS, or None (tracing off).

    Raises ValueError for a value the SDK does not define (a typo must not silently disable tracing).
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not exporter:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        exporter = "otlp" if endpoint else "none"
    if exporter == "none":
        return None
    if exporter == "console":
        return "console"
    if exporter != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter!r}: lipline supports otlp, console and none")
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    protocol = protocol.strip().lower()
    if protocol == "grpc":
        return "otlp-grpc"
    if protocol == "http/protobuf":
        return "otlp-http"
    raise ValueError(f"OTLP protocol {protocol!r}: lipline supports grpc and http/protobuf")


def _exporter(kind: str) -> Any:
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if kind == "otlp-http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

    return GrpcExporter()


def configure_tracing(service_name: str, environ: Mapping[str, str] | None = None, exporter: Any = None) -> bool:
    """Install the exporter the standard variables ask for; returns whether tracing is on.

    `exporter` replaces the chosen one (tests pass an in-memory exporter, with a simple processor).
    """
    global _ENABLED  # one process, one tracer provider: that is OpenTelemetry's own model
    environ = os.environ if environ is None else environ
    try:
        kind = "test" if exporter is not None else choose_exporter(environ)
    except ValueError as exc:  # at start-up, like a bad flag: one line and exit
        raise SystemExit(f"tracing configuration: {exc}") from exc
    if kind is None:
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    # Resource.create reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME; this is the default name.
    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)  # the sampler comes from OTEL_TRACES_SAMPLER(_ARG)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(_exporter(kind)))
    trace.set_tracer_provider(provider)
    _ENABLED = True
    _LOGGER.info("tracing enabled", extra={"exporter": kind})
    return True


def context_carrier() -> str:
    """The current trace context as text to store with a job (JSON of the W3C headers); "" when off."""
    if not _ENABLED:
        return ""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return json.dumps(carrier, sort_keys=True) if carrier else ""


def _stored_context(carrier: str) -> Any:
    try:
        return propagate.extract(json.loads(carrier)) if carrier else None
    except (ValueError, TypeError):  # a damaged row must not fail the work it describes
        return None


@contextlib.contextmanager
def job_span(name: str, job_id: str, parent: str = "", **attributes: Any) -> Iterator[Any]:
    """A span for a piece of one job's work (a segment, the audio track, the join), named after it
    and carrying the job id. `parent`: the job's stored context (`context_carrier` at SubmitJob), so
    every piece, on whichever worker, lands in the submitting request's trace."""
    if not _ENABLED:
        yield None
        return
    tracer = trace.get_tracer("lipline")
    with tracer.start_as_current_span(name, context=_stored_context(parent), kind=trace.SpanKind.INTERNAL) as span:
        span.set_attribute("lipline.job_id", job_id)
        for key, value in attributes.items():
            span.set_attribute(f"lipline.{key}", value)
        yield span


def record_job_span(job_id: str, parent: str, start_time: float, state: str, **attributes: Any) -> None:
    """The span of a whole job, from SubmitJob to its end (`start_time`: epoch seconds), recorded when
    it ends: no one process lives through a job (the gateway returns at once; segments run on any
    worker), so it is written afterwards with its true start, in the job's trace."""
    if not _ENABLED:
        return
    span = trace.get_tracer("lipline").start_span(
        "lipline job",
        context=_stored_context(parent),
        kind=trace.SpanKind.INTERNAL,
        start_time=int(start_time * 1e9),
    )
    span.set_attribute("lipline.job_id", job_id)
    span.set_attribute("lipline.state", state)
    for key, value in attributes.items():
        span.set_attribute(f"lipline.{key}", value)
    if state != "succeeded":
        span.set_status(Status(StatusCode.ERROR, state))
    span.end(end_time=time.time_ns())


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
