"""The chart's autoscaling run on the local services: an HPA controller whose pods are processes.

Every sync period, per scaled stage: read each metric of its HPA (or ScaledObject) from the real
Prometheus the way the adapter or KEDA would (services/local/chart_scaling.py), CPU from /proc as
metrics-server would, compute the desired replicas with the HPA's algorithm (services/local/hpa.py)
and start or stop processes to match, as the Deployment controller would:

- a new replica is PENDING until its gRPC health check answers SERVING; only then does it join its
  stage's address file (callers dial it) and Prometheus's targets (its metrics count);
- scale-down sends SIGTERM (the service drains: NOT_SERVING, finish or give back its work, exit);
  the replica leaves the address file and counts as being deleted at once, and is reaped when it exits;
  the youngest replica goes first (pending before ready), as a ReplicaSet's ranking would pick it.

Each sync's numbers are kept (`history`) for bench/autoscale.py's JSON and plot.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.local.chart_scaling import MetricSpec, ScalingObject
from services.local.cluster import LocalCluster
from services.local.hpa import (
    Controller,
    Phase,
    Pod,
    PodSample,
    external_average_replicas,
    external_value_replicas,
    pods_metric_replicas,
)
from services.local.prometheus import PrometheusError, PrometheusServer, pod_target

__all__ = ["Autoscaler", "Replica", "process_cpu_seconds"]

_LOGGER = logging.getLogger(__name__)
_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of a process and its children (the audio stage's decoder processes)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the command: state ppid ... utime (14th field of the line) stime (15th)
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


@dataclasses.dataclass
class Replica:
    """One process of a scaled stage, as its pod."""

    name: str
    pod: str
    started_s: float
    phase: Phase = Phase.PENDING
    ready_s: float = 0.0
    cpu: tuple[float, float] | None = None  # (when, CPU seconds) at the last sync
    exit_code: int | None = None

    def as_pod(self) -> Pod:
        return Pod(self.pod, self.phase, self.phase is Phase.RUNNING, self.started_s, self.ready_s or self.started_s)


def _serving(address: str) -> bool:
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


class Autoscaler:
    """One HPA controller per scaled stage over a started LocalCluster (with address_files) and Prometheus."""

    def __init__(
        self,
        cluster: LocalCluster,
        prometheus: PrometheusServer,
        objects: dict[str, ScalingObject],
        *,
        namespace: str,
        release: str,
        sync_period_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster, self.prometheus, self.objects = cluster, prometheus, objects
        self.namespace, self.release = namespace, release
        self.sync_period_s = sync_period_s
        self.clock = clock
        self.controllers = {s: Controller(o.min_replicas, o.max_replicas, o.behavior) for s, o in objects.items()}
        self.replicas: dict[str, list[Replica]] = {}
        self.gone: list[Replica] = []
        self.history: list[dict[str, Any]] = []
        self._next: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        now = clock()
        for name in cluster.processes:
            stage = cluster.service_of(name)
            index = 0 if name == stage else int(name.rsplit("-", 1)[1])
            self._next[stage] = max(self._next.get(stage, 0), index + 1)
            self.replicas.setdefault(stage, []).append(
                Replica(name, self.pod_name(stage, index), now, Phase.RUNNING, now)
            )
        self._publish()

    def pod_name(self, stage: str, index: int) -> str:
        """`<release>-<stage>-<i>`: what the chart's `pod=~"<release>-<stage>-.*"` matchers select."""
        return f"{self.release}-{stage}-{index}"

    # -- the processes ------------------------------------------------------------------------------
    def _publish(self) -> None:
        """Address files (ready replicas of dialed stages) and Prometheus targets (every ready replica)."""
        targets = []
        for stage, replicas in self.replicas.items():
            ready = [r for r in replicas if r.phase is Phase.RUNNING]
            self.cluster.publish_addresses(stage, [r.name for r in ready])
            for r in ready:
                address = f"127.0.0.1:{self.cluster.processes[r.name].metrics_port}"
                targets.append(pod_target(address, self.namespace, self.release, stage, r.pod))
        self.prometheus.set_targets(targets)

    def _poll_processes(self, now: float) -> None:
        changed = False
        for stage, replicas in self.replicas.items():
            for r in list(replicas):
                proc = self.cluster.processes[r.name]
                if proc.process.poll() is not None:
                    r.exit_code = proc.process.returncode
                    if r.phase is not Phase.DELETING:
                        _LOGGER.warning("replica exited unasked", extra={"replica": r.name, "code": r.exit_code})
                    replicas.remove(r)
                    self.gone.append(r)
                    changed = True
                elif r.phase is Phase.PENDING and proc.port_file.exists():
                    proc.wait_ready(1.0)
                    if _serving(proc.address):
                        r.phase, r.ready_s = Phase.RUNNING, now
                        changed = True
        if changed:
            self._publish()

    def _scale(self, stage: str, desired: int, now: float) -> None:
        replicas = self.replicas.setdefault(stage, [])
        live = [r for r in replicas if r.phase is not Phase.DELETING]
        for _ in range(desired - len(live)):
            index = self._next.get(stage, 0)
            self._next[stage] = index + 1
            name = stage if index == 0 else f"{stage}-{index}"
            self.cluster.start_service(name)
            replicas.append(Replica(name, self.pod_name(stage, index), now))
        if desired < len(live):
            # Pending first, then the youngest ready replica (a ReplicaSet's scale-down ranking).
            victims = sorted(live, key=lambda r: (r.phase is Phase.RUNNING, -r.started_s))[: len(live) - desired]
            for r in victims:
                r.phase = Phase.DELETING
                self.cluster.processes[r.name].signal_stop()
            self._publish()

    # -- the metrics --------------------------------------------------------------------------------
    def _cpu_samples(self, replicas: list[Replica], request: float, now: float) -> dict[str, PodSample]:
        samples = {}
        for r in replicas:
            if r.phase is not Phase.RUNNING:
                continue
            used = process_cpu_seconds(self.cluster.processes[r.name].process.pid)
            if r.cpu is not None and now > r.cpu[0]:
                percent = 100.0 * (used - r.cpu[1]) / (now - r.cpu[0]) / request
                samples[r.pod] = PodSample(percent, now, now - r.cpu[0])
            r.cpu = (now, used)
        return samples

    def _propose(
        self, obj: ScalingObject, metric: MetricSpec, replicas: list[Replica], now: float
    ) -> tuple[int | None, float | None]:
        """(proposed replicas or None, the metric's value as the HPA's status shows it)."""
        pods = [r.as_pod() for r in replicas]
        current = sum(1 for p in pods if p.phase is not Phase.DELETING)
        if metric.kind == "cpu":
            samples = self._cpu_samples(replicas, obj.cpu_request, now)
            value = sum(s.value for s in samples.values()) / len(samples) if samples else None
            return pods_metric_replicas(current, pods, samples, metric.target, cpu=True, now_s=now), value
        live = [p.name for p in pods if p.phase is not Phase.DELETING]
        try:
            rows = self.prometheus.query(metric.promql(live))
        except PrometheusError as exc:
            _LOGGER.warning("%s: metric %s: query failed: %s", obj.stage, metric.name, exc)
            return None, None
        if metric.kind == "pods":
            values = {r["metric"].get("pod", ""): float(r["value"][1]) for r in rows}
            samples = {pod: PodSample(v, now) for pod, v in values.items()}
            value = sum(values.values()) / len(values) if values else None
            return pods_metric_replicas(current, pods, samples, metric.target, now_s=now), value
        # External: every series the query returns counts (the HPA sums them); KEDA reads nothing as 0.
        series = [float(r["value"][1]) for r in rows] or ([0.0] if metric.empty_is_zero else [])
        total = sum(series) if series else None
        if metric.kind == "external-average":
            shown = None if total is None or current == 0 else total / current
            return external_average_replicas(current, series, metric.target), shown
        return external_value_replicas(current, pods, series, metric.target), total

    def sync(self) -> dict[str, Any]:
        """One sync period of every controller: poll, measure, decide, scale. Returns the record kept."""
        with self._lock:
            now = self.clock()
            self._poll_processes(now)
            record: dict[str, Any] = {"t": now, "stages": {}}
            for stage, obj in self.objects.items():
                replicas = self.replicas.get(stage, [])
                current = sum(1 for r in replicas if r.phase is not Phase.DELETING)
                proposals, metrics = [], []
                for metric in obj.metrics:
                    proposal, value = self._propose(obj, metric, replicas, now)
                    proposals.append(proposal)
                    metrics.append(
                        {
                            "name": metric.name,
                            "kind": metric.kind,
                            "value": value,
                            "target": metric.target,
                            "proposal": proposal,
                        }
                    )
                desired = self.controllers[stage].decide(current, proposals, now)
                if desired != current:
                    _LOGGER.info("scaling", extra={"stage": stage, "from": current, "to": desired})
                    self._scale(stage, desired, now)
                record["stages"][stage] = {
                    "current": current,
                    "desired": desired,
                    "ready": sum(1 for r in replicas if r.phase is Phase.RUNNING),
                    "pending": sum(1 for r in replicas if r.phase is Phase.PENDING),
                    "terminating": sum(1 for r in replicas if r.phase is Phase.DELETING),
                    "metrics": metrics,
                }
            self.history.append(record)
            return record

    # -- the loop -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="autoscaler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = self.clock()
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception:  # one failed sync (a process race) must not end the run; logged with its traceback
                _LOGGER.exception("autoscaler sync failed")
            next_at += self.sync_period_s
            # Between syncs, notice new replicas turning SERVING soon (the kubelet's probes run more often).
            while not self._stop.wait(min(0.2, max(0.0, next_at - self.clock()))) and self.clock() < next_at:
                with self._lock:
                    self._poll_processes(self.clock())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
