"""A real Prometheus (the `prometheus` binary: Debian's package) scraping the local services.

Local mode has no prometheus-operator, so this writes the configuration the chart's ServiceMonitor
would make it generate: each replica a target with the labels Kubernetes service discovery attaches
(`namespace`, `pod`, `service`, `job` = the Service, `endpoint`), the ServiceMonitor's relabeling
(`component` from the pod's app.kubernetes.io/component label) and its scrape interval; the chart's
rule file is loaded as the PrometheusRule would load it. Targets come from a file (`file_sd_configs`),
rewritten when replicas come and go, as endpoints change in a cluster.

bench/autoscale.py and the integration tests (dashboards, alerts, adapter queries) use it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PrometheusError", "PrometheusServer", "Target", "missing_reason", "pod_target"]


class PrometheusError(RuntimeError):
    """The server refused a query (bad PromQL, a timeout): its own message."""


def missing_reason(binary: str = "prometheus") -> str:
    """Why no Prometheus can start here ("" when one can)."""
    if shutil.which(binary) is None:
        return "needs the prometheus server (Debian package 'prometheus'; bash scripts/install.sh installs it)"
    return ""


@dataclass(frozen=True)
class Target:
    """One /metrics endpoint and the labels a ServiceMonitor's service discovery gives its series."""

    address: str
    labels: Mapping[str, str]


def pod_target(metrics_address: str, namespace: str, release: str, stage: str, pod: str) -> Target:
    """A replica's target with the labels the chart's ServiceMonitor gives it in a cluster: `namespace`,
    `pod`, `service` and `job` (the stage's Service, `<release>-<stage>`), `endpoint`, and `component`
    (the ServiceMonitor's relabeling of the pod's app.kubernetes.io/component label)."""
    service = f"{release}-{stage}"
    labels = {
        "namespace": namespace,
        "pod": pod,
        "service": service,
        "job": service,
        "endpoint": "metrics",
        "component": stage,
    }
    return Target(metrics_address, labels)


#: how often `start` picks another port after the one it probed was taken
PORT_TRIES = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


@dataclass
class PrometheusServer:
    """`with PrometheusServer(workdir, scrape_interval_s=1) as prom: prom.set_targets(...); prom.query(...)`.

    Attributes:
        workdir: its configuration, targets file, data and log.
        scrape_interval_s: every target's scrape interval (the ServiceMonitor's `interval`).
        evaluation_interval_s: how often rules are evaluated (default: the scrape interval).
        rule_files: Prometheus rule files to load (the chart's files/prometheus-rules.yaml).
        binary: the prometheus executable (a path, or a name on PATH).
    """

    workdir: Path
    scrape_interval_s: float = 15.0
    evaluation_interval_s: float = 0.0
    rule_files: Sequence[Path] = ()
    binary: str = "prometheus"
    url: str = ""
    _process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def targets_file(self) -> Path:
        return self.workdir / "targets.json"

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 60.0) -> None:
        reason = missing_reason(self.binary)
        if reason:
            raise RuntimeError(reason)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.targets_file.exists():
            self.set_targets([])
        interval = _duration(self.scrape_interval_s)
        config = {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": _duration(self.evaluation_interval_s or self.scrape_interval_s),
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": "lipline",
                    "metrics_path": "/metrics",
                    # A target's own `job` label (the Service's name, as the operator sets it) wins over job_name.
                    "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "1s"}],
                }
            ],
        }
        # JSON is YAML: no YAML writer needed (the GPU host's Python may lack PyYAML).
        (self.workdir / "prometheus.yml").write_text(json.dumps(config, indent=1))
        # The port is probed, then bound by Prometheus: another process (a parallel test run) may take it
        # in between, so a start that fails with "address already in use" tries another port.
        for attempt in range(PORT_TRIES):
            port = _free_port()
            self.url = f"http://127.0.0.1:{port}"
            log = (self.workdir / "prometheus.log").open("wb")
            self._process = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    # Grafana asks for ranges up to now; small lookback so a stopped replica's series end soon.
                    "--query.lookback-delta=5m",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
            deadline = time.monotonic() + timeout_s
            while not self._ready():
                if self._process.poll() is not None:
                    tail = self.log_tail()
                    if "address already in use" in tail.lower() and attempt + 1 < PORT_TRIES:
                        break
                    raise RuntimeError(f"prometheus exited {self._process.returncode}:\n{tail}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"prometheus not ready after {timeout_s:.0f} s:\n{self.log_tail()}")
                time.sleep(0.1)
            else:
                return

    def log_tail(self, chars: int = 3000) -> str:
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def set_targets(self, targets: Sequence[Target]) -> None:
        """Replace the scraped targets (written atomically: Prometheus never reads half a file)."""
        groups = [{"targets": [t.address], "labels": dict(t.labels)} for t in targets]
        self.workdir.mkdir(parents=True, exist_ok=True)
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, self.targets_file)

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=30) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:  # 400/422: a bad query; the body says why
            body = json.loads(exc.read() or b"{}")
            raise PrometheusError(f"{path} {params}: {body.get('error', exc)}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str, at_s: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result (vector rows, or a scalar as one row)."""
        params = {"query": expr} if at_s is None else {"query": expr, "time": f"{at_s:.3f}"}
        data = self.api("query", **params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start_s: float, end_s: float, step_s: float) -> list[dict[str, Any]]:
        """A range query's matrix (what a Grafana time series panel asks for)."""
        data = self.api("query_range", query=expr, start=f"{start_s:.3f}", end=f"{end_s:.3f}", step=f"{step_s:.3f}")
        return data["result"]
