"""Every Prometheus metric lipline exports, declared in one place (names of docs/architecture.md section 5).

One family per concept with a `stage` label, so one Grafana dashboard and one prometheus-adapter rule
serve every stage. Labels are bounded (stage, method, code, status); never an id.
"""

from __future__ import annotations

import logging
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_LOGGER = logging.getLogger(__name__)

# Latency buckets from 1 ms to 2 min: stage calls are short, whole streams and jobs are long.
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_FRAME_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    """The metric families of one process, on their own registry (tests can run several)."""

    def __init__(self, stage: str, registry: CollectorRegistry | None = None) -> None:
        self.stage = stage
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "lipline_stage_requests",
            "RPCs finished, by method and status code",
            ["stage", "method", "code"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "lipline_stage_request_seconds", "RPC duration", ["stage", "method"], buckets=_SECONDS, registry=r
        )
        self.items = Counter("lipline_stage_items", "items processed (frames, windows, crops)", ["stage"], registry=r)
        self.queue_seconds = Histogram(
            "lipline_stage_queue_seconds", "time an item waits for a batch", ["stage"], buckets=_SECONDS, registry=r
        )
        self.compute_seconds = Histogram(
            "lipline_stage_compute_seconds", "model time per batch", ["stage"], buckets=_SECONDS, registry=r
        )
        self.batch_size = Histogram(
            "lipline_stage_batch_size", "items per batch", ["stage"], buckets=_BATCH, registry=r
        )
        self.inflight = Gauge(
            "lipline_stage_inflight_items", "items accepted and not yet answered", ["stage"], registry=r
        )
        self.queue_depth = Gauge("lipline_stage_queue_depth", "items waiting for a batch", ["stage"], registry=r)
        self.backend_info = Gauge(
            "lipline_backend_info",
            "constant 1, labelled with what runs the model",
            ["stage", "model", "backend", "precision", "torch", "cuda", "cudnn", "tensorrt"],
            registry=r,
        )
        self.cudnn_ok = Gauge("lipline_cudnn_ok", "1 if the cuDNN self-check passed (GPU only)", ["stage"], registry=r)
        self.numerics_error = Gauge(
            "lipline_numerics_relative_error",
            "start-up relative error of the backend vs fp32 (GPU only)",
            ["stage"],
            registry=r,
        )
        # Gateway job metrics live on the same registry so the gateway has one /metrics too.
        self.jobs = Counter("lipline_jobs", "jobs finished, by final status", ["status"], registry=r)
        self.job_seconds = Histogram("lipline_job_seconds", "SubmitJob to finished MP4", buckets=_SECONDS, registry=r)
        self.job_realtime_factor = Histogram(
            "lipline_job_realtime_factor",
            "audio seconds per wall second of a finished job",
            buckets=(0.25, 0.5, 1, 2, 5, 10, 20, 50, 100),
            registry=r,
        )
        self.render_first_frame_seconds = Histogram(
            "lipline_render_first_frame_seconds",
            "start of a job to its first encoded frame",
            buckets=_SECONDS,
            registry=r,
        )
        # Render workers and the job store (docs/architecture.md section 5). The queue gauges describe the one
        # shared queue, so every worker exports the same value: aggregate with max(), not sum().
        self.segments = Counter(
            "lipline_segments", "tasks (segments and joins) ended by this worker, by status", ["status"], registry=r
        )
        self.queue_tasks = Gauge(
            "lipline_queue_depth", "tasks waiting to be claimed, by kind (segment, join)", ["kind"], registry=r
        )
        self.queue_leased = Gauge("lipline_queue_leased", "tasks held by a live lease", registry=r)
        self.queue_oldest_seconds = Gauge(
            "lipline_queue_oldest_seconds", "age of the oldest claimable task", registry=r
        )
        self.queue_wait_seconds = Histogram(
            "lipline_queue_wait_seconds", "task creation (or last release) to its claim", buckets=_SECONDS, registry=r
        )
        self.lease_lost = Counter(
            "lipline_lease_lost", "leases lost while working (expired, or the job was cancelled)", registry=r
        )
        self.render_frames = Counter("lipline_render_frames", "frames composited and encoded", registry=r)
        self.render_composite_seconds = Histogram(
            "lipline_render_composite_seconds", "compositing time per frame", buckets=_FRAME_SECONDS, registry=r
        )
        self.render_encode_seconds = Histogram(
            "lipline_render_encode_seconds", "x264 time per frame", buckets=_FRAME_SECONDS, registry=r
        )
        self.render_busy = Gauge("lipline_render_busy", "1 while this worker holds a task", registry=r)
        self.render_loop_healthy = Gauge(
            "lipline_render_loop_healthy",
            "1 while this worker's claim loop runs (0: it ended or stalled; health says NOT_SERVING)",
            registry=r,
        )
        self.render_loop_age_seconds = Gauge(
            "lipline_render_loop_age_seconds",
            "seconds since the claim loop's last iteration or lease renewal",
            registry=r,
        )
        self.secret_reloads = Counter(
            "lipline_secret_reloads",
            "changes of a secret file picked up (result=reloaded) or refused because it did not parse (result=refused, "
            "the previous secrets stay): file=api_keys or webhook_secrets",
            ["file", "result"],
            registry=r,
        )
        self.quarantined = Counter(
            "lipline_quarantined",
            "rows and blobs a worker could not interpret, set aside (job failed or task deleted), by reason",
            ["reason"],
            registry=r,
        )
        self.retention_deleted = Counter(
            "lipline_retention_deleted",
            "blobs the render workers' janitor deleted: expired outputs (kind=output), working files ended jobs left behind "
            "(kind=files), files of jobs and avatars no row refers to (kind=unreferenced)",
            ["kind"],
            registry=r,
        )
        # Live workers (issue 19; services/live): sessions, frames, latency, admission, the face link.
        self.live_sessions = Gauge(
            "lipline_live_sessions",
            "live sessions held by this worker, by state (active, streaming, draining)",
            ["state"],
            registry=r,
        )
        self.live_frame_latency_seconds = Histogram(
            "lipline_live_frame_latency_seconds",
            "a speech frame's own audio arrived -> the frame sent (the model's 212.5 ms look-ahead is most of it)",
            buckets=(0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.75, 1.0, 2.0),
            registry=r,
        )
        self.live_frames = Counter(
            "lipline_live_frames",
            "live frames by kind: speech and idle sent, skipped (late), dropped (the client read too slowly)",
            ["kind"],
            registry=r,
        )
        self.live_clear_seconds = Histogram(
            "lipline_live_clear_seconds",
            "Clear received -> the first idle frame after it sent",
            buckets=_SECONDS,
            registry=r,
        )
        self.live_admission_refused = Counter(
            "lipline_live_admission_refused",
            "OpenSession refused RESOURCE_EXHAUSTED because the worker was full",
            registry=r,
        )
        self.live_link_messages = Counter(
            "lipline_live_link_messages",
            "face link messages with items sent, by stage (lipsync, superres)",
            ["stage"],
            registry=r,
        )
        self.live_link_items_per_message = Histogram(
            "lipline_live_link_items_per_message",
            "items per face link message, by stage: sessions batched per tick",
            ["stage"],
            buckets=_BATCH,
            registry=r,
        )
        self.live_link_faces = Counter(
            "lipline_live_link_faces",
            "face link items by outcome (face, late, shed: not sent, the stage could not answer it in time; failed, dropped)",
            ["outcome"],
            registry=r,
        )
        # The gateway's webhook deliveries (services/gateway/webhooks.py), one per attempt.
        self.webhook_attempts = Counter(
            "lipline_webhook_attempts",
            "webhook POST attempts by result: delivered (2xx), failed (another status), timeout, unreachable, gave_up",
            ["result"],
            registry=r,
        )
        # The web page's server (services/web): its HTTP requests count in lipline_stage_requests
        # (method = the route's name, code = the HTTP status); its live WebSockets here.
        self.web_live_sockets = Gauge(
            "lipline_web_live_sockets", "live-session WebSockets open on this web server", registry=r
        )
        self.web_live_resumed = Counter(
            "lipline_web_live_resumed",
            "live sessions a page resumed on a new WebSocket after its socket dropped (or this server or a gateway restarted)",
            registry=r,
        )
        self.web_live_refused = Counter(
            "lipline_web_live_refused",
            "live WebSockets refused before a session: origin (not one of the page's origins), key (none sent), start (bad first message)",
            ["reason"],
            registry=r,
        )
        r.register(GpuCollector())

    def set_backend(self, model: str, backend: str, precision: str) -> None:
        """lipline_backend_info for this process. torch's versions are read only where torch is
        already loaded (the GPU stages): a service without torch (audio) must not import it for a label."""
        import sys

        torch_version = cuda = cudnn = ""
        torch = sys.modules.get("torch")
        if torch is not None:
            torch_version, cuda = torch.__version__, torch.version.cuda or ""
            cudnn = str(torch.backends.cudnn.version() or "") if torch.backends.cudnn.is_available() else ""
        try:
            import tensorrt

            trt = tensorrt.__version__
        except Exception:  # noqa: BLE001 - not installed is the normal case off-GPU
            trt = ""
        self.backend_info.clear()
        self.backend_info.labels(self.stage, model, backend, precision, torch_version, cuda, cudnn, trt).set(1)


class GpuCollector(Collector):
    """Per-GPU utilisation, memory and power from NVML, read at scrape time; nothing without a GPU."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception:  # noqa: BLE001 - no NVML library or no GPU: export nothing
            self._nvml = None

    def collect(self):
        families = {
            "util": GaugeMetricFamily("lipline_gpu_utilization_ratio", "GPU busy fraction (NVML)", labels=["gpu"]),
            "used": GaugeMetricFamily("lipline_gpu_memory_used_bytes", "GPU memory in use", labels=["gpu"]),
            "total": GaugeMetricFamily("lipline_gpu_memory_total_bytes", "GPU memory size", labels=["gpu"]),
            "power": GaugeMetricFamily("lipline_gpu_power_watts", "GPU power draw", labels=["gpu"]),
        }
        nv = self._nvml
        if nv is not None:
            with self._lock:
                try:
                    for i in range(nv.nvmlDeviceGetCount()):
                        h = nv.nvmlDeviceGetHandleByIndex(i)
                        mem = nv.nvmlDeviceGetMemoryInfo(h)
                        families["util"].add_metric([str(i)], nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
                        families["used"].add_metric([str(i)], float(mem.used))
                        families["total"].add_metric([str(i)], float(mem.total))
                        families["power"].add_metric([str(i)], nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
                except Exception:
                    _LOGGER.debug("NVML read failed", exc_info=True)
        yield from families.values()


def start_metrics_server(metrics: Metrics, port: int, host: str = "0.0.0.0") -> int:
    """Serve /metrics on `port` (0 = any free port); returns the bound port, or -1 when disabled."""
    if port < 0:
        return -1
    server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    return int(server.server_address[1])
