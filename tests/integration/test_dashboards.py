"""Every shipped Grafana panel and every alert expression, answered by live metrics (issue 22).

One local cluster (gateway, the stages with the musetalk tier's, a render worker, a live worker that holds one session) and
one real Prometheus (services/local/prometheus.py: the chart's ServiceMonitor labels, its rule file)
serve both tests, under a small load: jobs with super-resolution, a live session that speaks, is
cleared and speaks again, a second session refused because the worker is full, and a stream of faces
from the musetalk tier's stage.

Panels are run as Grafana runs them: a range query over the load with `$namespace` set to the
cluster's namespace and `$__interval`/`$__rate_interval` as Grafana derives them from the data
source's scrape interval (1 s here). A panel fails when no series has a value, or a value no metric
can have (below 0; above 1 for a `percentunit` panel). Alerts: each expression less its threshold
(the quantity it compares; both sides of an `or`, the left of an `unless`), evaluated now, must give
a value, a ratio at most 1. GPU metrics exist only on a GPU: there they must answer, on a CPU they
must be empty.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
import torch
import yaml

from lipline.v1 import gateway_pb2, lipsync_pb2, lipsync_pb2_grpc, session_pb2
from lipline_client import NO_RETRY
from services.gateway.client import LiplineClient
from services.gateway.live_client import pcm_chunks, pcm_of_audio
from services.local.cluster import REPO_ROOT, LocalCluster
from services.local.prometheus import PrometheusServer, missing_reason, pod_target
from services.media.musetalk_wire import pack_items, pack_latents, pack_window
from tests.integration.util import SAMPLES, cut_wav, eventually, stage_channel, start_cluster

DASHBOARDS = sorted((REPO_ROOT / "helm" / "lipline" / "files" / "dashboards").glob("*.json"))
RULES = REPO_ROOT / "helm" / "lipline" / "files" / "prometheus-rules.yaml"
NAMESPACE, RELEASE = "lipline-dash", "lipline"
SCRAPE_S = 1.0
GPU_ONLY = re.compile(r"lipline_gpu_|lipline_cudnn_ok")
RATE = 16000

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(missing_reason()), reason=missing_reason() or "prometheus")]


@dataclass
class Live:
    cluster: LocalCluster
    prometheus: PrometheusServer
    start_s: float


def _talk(client: LiplineClient, session: session_pb2.Session, pcm: bytes) -> None:
    """A session: 1 s of speech, Clear, the rest, EndOfUtterance; the stream held until playback ends."""
    finished, sent = threading.Event(), threading.Event()
    chunks = pcm_chunks(pcm, RATE, 20)

    def requests() -> Iterator[session_pb2.ConverseRequest]:
        start = session_pb2.ConverseStart(session_id=session.id, resume_token=session.resume_token, last_frame=-1)
        yield session_pb2.ConverseRequest(start=start)
        t0 = time.monotonic()
        for i, chunk in enumerate(chunks):
            time.sleep(max(0.0, t0 + i * 0.02 - time.monotonic()))
            if i == 50:
                yield session_pb2.ConverseRequest(clear=session_pb2.Clear())
            yield session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=chunk))
        yield session_pb2.ConverseRequest(end_of_utterance=session_pb2.EndOfUtterance())
        sent.set()
        finished.wait(15)

    for response in client.converse(requests()):
        kind = response.WhichOneof("response")
        # Clear ends a playback too: the one that counts comes after the end of the utterance.
        if kind == "event" and response.event.kind == session_pb2.SessionEvent.PLAYBACK_FINISHED and sent.is_set():
            finished.set()
            break
    client.close_session(session.id)


def _musetalk_load(cluster: LocalCluster) -> None:
    """Faces from the 256 px tier's stage (its dashboard row): a stream straight to it, as the workers' will be."""
    mel = np.full((80, 3000), -0.7, np.float32)
    mel[:, :400] = 0.5
    first = lipsync_pb2.MuseTalkGenerateRequest(
        latents=pack_latents([0], np.zeros((1, 8, 32, 32))), windows=[pack_window(0, mel[:, :600], -0.7)]
    )
    items = [
        lipsync_pb2.MuseTalkGenerateRequest(
            items=pack_items(range(i, i + 8), [0] * 8, [0] * 8, range(2 * i, 2 * i + 16, 2))
        )
        for i in range(0, 96, 8)
    ]
    with stage_channel(cluster, "lipsync-musetalk") as channel:
        stub = lipsync_pb2_grpc.MuseTalkServiceStub(channel)
        # One item first, then a scrape or two before the rest: the stage's histograms get their series at
        # the first batch, and a rate() sees an increase only from a scrape that found the series before it.
        assert sum(len(r.faces.frame_indices) for r in stub.Generate(iter([first, items[0]]), timeout=120)) == 8
        time.sleep(2 * SCRAPE_S)
        assert sum(len(r.faces.frame_indices) for r in stub.Generate(iter([first, *items]), timeout=120)) == 96


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    workdir = tmp_path_factory.mktemp("dashboards")
    extra = {"gateway": ["--segment-seconds=0.8"], "live": ["--max-sessions=1"]}
    replicas = {"render": 1, "live": 1, "lipsync-musetalk": 1}
    with start_cluster(workdir / "cluster", replicas=replicas, extra_args=extra) as cluster:
        with PrometheusServer(workdir / "prometheus", scrape_interval_s=SCRAPE_S, rule_files=[RULES]) as prom:
            prom.set_targets(
                [
                    pod_target(
                        f"127.0.0.1:{p.metrics_port}", NAMESPACE, RELEASE, cluster.service_of(n), f"{RELEASE}-{n}-0"
                    )
                    for n, p in cluster.processes.items()
                ]
            )
            eventually(lambda: len(prom.query("up == 1")) == len(cluster.processes), 30, "every service to be scraped")
            start_s = time.time()
            with LiplineClient(cluster.gateway_address, timeout=120) as client:
                avatar = client.create_avatar((SAMPLES / "avatar.jpg").read_bytes())
                speech = cut_wav((SAMPLES / "speech.wav").read_bytes(), 2.4)
                session = client.create_session(avatar.id, sample_rate=RATE)
                talker = threading.Thread(target=_talk, args=(client, session, pcm_of_audio(speech, RATE) * 2))
                talker.start()
                # The one live worker is full: the gateway refuses a second session.
                with (
                    LiplineClient(cluster.gateway_address, timeout=30, retry=NO_RETRY) as once,
                    pytest.raises(grpc.RpcError) as refused,
                ):
                    once.create_session(avatar.id, sample_rate=RATE)
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                jobs = [client.submit_job(avatar.id, speech, super_resolution=True).id for _ in range(2)]
                for job in jobs:
                    assert client.wait(job).state == gateway_pb2.JOB_STATE_SUCCEEDED
                talker.join(60)
            _musetalk_load(cluster)
            time.sleep(3 * SCRAPE_S)  # the last samples scraped, the rules evaluated
            yield Live(cluster, prom, start_s)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield from _panels(panel.get("panels", []))
        if panel.get("targets"):
            yield panel


def _grafana_expr(expr: str, interval_s: float) -> str:
    """The query Grafana sends: its template variables substituted (Prometheus data source, scrape interval 1 s)."""
    rate_interval = max(interval_s + SCRAPE_S, 4 * SCRAPE_S)
    return (
        expr.replace("$namespace", NAMESPACE)
        .replace("${namespace}", NAMESPACE)
        .replace("$__rate_interval", f"{round(rate_interval * 1000)}ms")
        .replace("$__interval", f"{round(interval_s * 1000)}ms")
    )


def _values(rows: list[dict[str, Any]]) -> list[float]:
    found = [float(v) for r in rows for _, v in r.get("values", [r.get("value", [0, "NaN"])])]
    return [v for v in found if not math.isnan(v)]


PANELS = [
    (path.stem, panel, target["expr"])
    for path in DASHBOARDS
    for panel in _panels(json.loads(path.read_text())["panels"])
    for target in panel["targets"]
]


def test_every_dashboard_variable_resolves(live: Live) -> None:
    for path in DASHBOARDS:
        for variable in json.loads(path.read_text())["templating"]["list"]:
            if variable["type"] != "query":
                continue
            metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["query"]["query"]).groups()
            assert NAMESPACE in live.prometheus.api(f"label/{label}/values", **{"match[]": metric}), variable


@pytest.mark.parametrize(
    ("dashboard", "panel", "expr"), PANELS, ids=[f"{d}:{p['title']}:{i}" for i, (d, p, _) in enumerate(PANELS)]
)
def test_every_panel_answers_with_live_data(live: Live, dashboard: str, panel: dict[str, Any], expr: str) -> None:
    end = time.time()
    # Grafana's $__interval: the range over the panel's width (~1000 points), never below the scrape interval.
    interval = max(SCRAPE_S, (end - live.start_s) / 1000)
    query = _grafana_expr(expr, interval)
    values = _values(live.prometheus.query_range(query, live.start_s, end, interval))
    if GPU_ONLY.search(expr) and not torch.cuda.is_available():
        assert values == [], f"{panel['title']}: GPU series on a CPU-only run: {query}"
        return
    assert values, f"{dashboard} panel {panel['title']!r} shows no data: {query}"
    assert min(values) >= 0, f"{panel['title']!r}: a negative value ({min(values)}) from {query}"
    if panel.get("fieldConfig", {}).get("defaults", {}).get("unit") == "percentunit":
        assert max(values) <= 1, f"{panel['title']!r}: a ratio above 1 ({max(values)}) from {query}"


_THRESHOLD = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*[-+]?[0-9.]+(e[-+]?\d+)?\s*$")


def alert_quantity(expr: str) -> str:
    """What an alert compares: the expression less its threshold, both sides of a top-level `or`,
    the left side of an `unless` (that alert's healthy answer is nothing)."""
    expr = " ".join(expr.split())
    expr = re.split(r"\sunless\s", expr)[0]
    parts = [_THRESHOLD.sub("", part) for part in re.split(r"\sor\s", expr)]
    return " or ".join(f"({p})" for p in parts)


ALERTS = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_alert_quantity_strips_thresholds_only() -> None:
    assert alert_quantity("lipline:x:rate5m > 0.05") == "(lipline:x:rate5m)"
    assert alert_quantity("a unless on (pod) b") == "(a)"
    assert alert_quantity("sum(rate(a[5m])) > 0\nor sum(rate(b[5m])) > 0") == "(sum(rate(a[5m]))) or (sum(rate(b[5m])))"


@pytest.mark.parametrize("rule", ALERTS, ids=[r["alert"] for r in ALERTS])
def test_every_alert_expression_evaluates_to_data(live: Live, rule: dict[str, Any]) -> None:
    quantity = alert_quantity(rule["expr"])
    rows = live.prometheus.query(quantity)
    values = _values(rows)
    if GPU_ONLY.search(quantity) and not torch.cuda.is_available():
        assert values == [], f"{rule['alert']}: GPU series on a CPU-only run"
        return
    assert values, f"{rule['alert']}: {quantity} returns nothing: the alert could never fire"
    assert min(values) >= 0, f"{rule['alert']}: {quantity} = {min(values)}"
    if "ratio" in quantity or "/ clamp_min" in quantity:
        assert max(values) <= 1, f"{rule['alert']}: a ratio above 1 ({max(values)}) from {quantity}"
    # The whole rule (threshold and all) is valid PromQL that Prometheus accepts now.
    live.prometheus.query(" ".join(rule["expr"].split()))
