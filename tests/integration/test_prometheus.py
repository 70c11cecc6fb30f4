"""A real Prometheus (Debian's package) scraping every running service, with the chart's rules.

What the chart promises Prometheus, checked against the real thing: every service's /metrics is
scraped, a job shows up as per-stage items, the chart's recording rules and alerts
(helm/lipline/files/prometheus-rules.yaml) load and evaluate without errors and yield data, and the
prometheus-adapter queries behind the HPAs (files/adapter-rules.yaml), expanded the way the adapter
expands them, return one value per pod. Targets carry `namespace` and `pod` labels as Kubernetes
service discovery would attach them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import yaml

from lipline.v1 import gateway_pb2
from services.gateway.client import LiplineClient
from services.local.cluster import REPO_ROOT, LocalCluster
from services.local.prometheus import PrometheusServer, Target, missing_reason
from tests.helpers.tools import helm_binary
from tests.integration.util import eventually

RULES = REPO_ROOT / "helm" / "lipline" / "files" / "prometheus-rules.yaml"
ADAPTER = REPO_ROOT / "helm" / "lipline" / "files" / "adapter-rules.yaml"
NAMESPACE = "lipline-test"
RELEASE = "lipline"  # the chart names its objects lipline-<stage> for this release name

pytestmark = pytest.mark.skipif(bool(missing_reason()), reason=missing_reason() or "prometheus")


def _pod(service: str) -> str:
    """The pod name a Deployment of release RELEASE would give this service's replica."""
    return f"{RELEASE}-{service}-7c9f5-x2x4q"


@pytest.fixture(scope="module")
def live_cluster(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The shared cluster with a live worker for this module (its sessions' gauge feeds an adapter rule
    and a KEDA trigger); the other modules' clusters have none."""
    cluster.add_replica("live")
    try:
        yield cluster
    finally:
        cluster.remove_replica("live")


@pytest.fixture(scope="module")
def prometheus(live_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    cluster = live_cluster
    with PrometheusServer(tmp_path_factory.mktemp("prometheus"), scrape_interval_s=1.0, rule_files=[RULES]) as prom:
        prom.set_targets(
            [
                Target(f"127.0.0.1:{p.metrics_port}", {"namespace": NAMESPACE, "pod": _pod(name)})
                for name, p in cluster.processes.items()
            ]
        )
        yield prom


def test_prometheus_scrapes_every_service(prometheus: PrometheusServer, cluster: LocalCluster) -> None:
    def all_up() -> list[dict[str, Any]]:
        targets = prometheus.api("targets")["activeTargets"]
        return targets if len(targets) == len(cluster.processes) and all(t["health"] == "up" for t in targets) else []

    targets = eventually(all_up, what="every service's /metrics to be scraped")
    assert {t["labels"]["pod"] for t in targets} == {_pod(name) for name in cluster.processes}


def test_a_job_shows_up_per_stage_and_in_the_chart_rules(
    prometheus: PrometheusServer, client: LiplineClient, avatar_bytes: bytes, speech_bytes: bytes
) -> None:
    avatar = client.create_avatar(avatar_bytes)
    job = client.wait(client.submit_job(avatar.id, speech_bytes, super_resolution=True).id)
    assert job.state == gateway_pb2.JOB_STATE_SUCCEEDED, job.error

    def stages_with_items() -> set[str]:
        rows = prometheus.query(f'sum by (stage) (lipline_stage_items_total{{namespace="{NAMESPACE}"}}) > 0')
        found = {r["metric"]["stage"] for r in rows}
        return found if {"audio", "lipsync", "superres"} <= found else set()

    eventually(stages_with_items, what="items of the audio, lipsync and superres stages")

    def recorded() -> bool:  # a new series needs two scrapes before rate() has a value: wait for both stages
        return {"lipsync", "superres"} <= {
            r["metric"].get("stage", "") for r in prometheus.query("lipline:stage_items:rate1m")
        }

    eventually(recorded, what="the chart's recording rule lipline:stage_items:rate1m for lipsync and superres")
    succeeded = f'sum(lipline_jobs_total{{namespace="{NAMESPACE}",status="succeeded"}}) >= 1'
    eventually(lambda: prometheus.query(succeeded), what="the gateway's count of succeeded jobs")


def test_every_chart_rule_loads_and_evaluates_cleanly(prometheus: PrometheusServer) -> None:
    expected = {
        r.get("record") or r.get("alert") for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
    }

    def evaluated() -> list[dict[str, Any]]:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        return (
            rules
            if len(rules) == len(expected) and all(r.get("lastEvaluation", "").startswith("20") for r in rules)
            else []
        )

    rules = eventually(evaluated, what="every chart rule to be evaluated")
    assert {r["name"] for r in rules} == expected
    bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not bad, f"rules failing in Prometheus: {bad}"
    firing = [r["name"] for r in rules if r.get("state") == "firing"]
    assert not firing, f"alerts firing on a healthy test cluster: {firing}"


def _adapter_query(rule: dict[str, Any], services: tuple[str, ...] = ("lipsync", "superres")) -> str:
    """The query prometheus-adapter sends for the HPA of the `services`' pods in NAMESPACE (its <<.X>> templating)."""
    series = rule["seriesQuery"].split("{")[0]
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod=~"{"|".join(_pod(s) for s in services)}"')
        .replace("<<.GroupBy>>", "pod")
    )


def test_adapter_queries_give_one_value_per_pod(
    prometheus: PrometheusServer, client: LiplineClient, avatar_bytes: bytes, speech_bytes: bytes
) -> None:
    rules = {r["name"]["as"]: r for r in yaml.safe_load(ADAPTER.read_text())["rules"]}
    avatar = client.create_avatar(avatar_bytes)
    client.wait(client.submit_job(avatar.id, speech_bytes, super_resolution=True).id)

    queue = _adapter_query(rules["lipline_stage_queue_mean_seconds"])
    rows = eventually(lambda: prometheus.query(queue), what=f"a value of {queue}")
    pods = [r["metric"]["pod"] for r in rows]
    assert len(pods) == len(set(pods)) and set(pods) <= {_pod("lipsync"), _pod("superres")}
    assert all(float(r["value"][1]) >= 0 for r in rows)
    _check_gpu_rows(prometheus.query(_adapter_query(rules["lipline_gpu_utilization_ratio"])))
    # The live workers' sessions: one value per live worker (none is open here: 0).
    sessions = _adapter_query(rules["lipline_live_sessions_active"], ("live",))
    rows = eventually(lambda: prometheus.query(sessions), what=f"a value of {sessions}")
    assert [r["metric"]["pod"] for r in rows] == [_pod("live")] and float(rows[0]["value"][1]) == 0


def _check_gpu_rows(rows: list[dict[str, Any]]) -> None:
    """NVML exports GPU utilisation only where the services run on a GPU: on the CPU the query is
    empty, and on a GPU it must not be (a missing NVML binding is exactly what this catches)."""
    if not torch.cuda.is_available():
        assert rows == []
    else:
        assert rows, "no lipline_gpu_utilization_ratio on a GPU: is nvidia-ml-py (pynvml) installed?"
    assert all(0 <= float(r["value"][1]) <= 1 for r in rows)


def test_keda_trigger_queries_as_rendered_by_the_chart(
    prometheus: PrometheusServer, client: LiplineClient, avatar_bytes: bytes, speech_bytes: bytes
) -> None:
    helm = helm_binary()
    rendered = subprocess.run(
        [
            helm,
            "template",
            RELEASE,
            str(REPO_ROOT / "helm" / "lipline"),
            "--namespace",
            NAMESPACE,
            "--set",
            "keda.enabled=true",
            "--set",
            "stages.superres.autoscaling.metric=queue",
            "--set-json",
            "stages.superres.autoscaling.target=0.02",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    triggers = {
        d["metadata"]["name"]: d["spec"]["triggers"][0]["metadata"]["query"]
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "ScaledObject"
    }
    assert set(triggers) == {f"{RELEASE}-lipsync", f"{RELEASE}-superres", f"{RELEASE}-render", f"{RELEASE}-live"}
    # Live workers scale on their active sessions averaged over their pods: one value (0: none open).
    rows = eventually(lambda: prometheus.query(triggers[f"{RELEASE}-live"]), what="the live KEDA query")
    assert len(rows) == 1 and float(rows[0]["value"][1]) == 0
    # Render workers scale on the segments waiting (the job store is SQLite here: a Prometheus trigger);
    # every worker exports the shared queue, so the query has one value whatever the worker count.
    rows = eventually(lambda: prometheus.query(triggers[f"{RELEASE}-render"]), what="the render KEDA query")
    assert len(rows) == 1 and float(rows[0]["value"][1]) >= 0
    avatar = client.create_avatar(avatar_bytes)
    client.wait(client.submit_job(avatar.id, speech_bytes, super_resolution=True).id)
    # superres scales on queue time, which the job above gives a value.
    rows = eventually(lambda: prometheus.query(triggers[f"{RELEASE}-superres"]), what="the superres KEDA query")
    assert len(rows) == 1 and float(rows[0]["value"][1]) >= 0
    # lipsync scales on GPU utilisation, which only exists on a GPU.
    _check_gpu_rows(prometheus.query(triggers[f"{RELEASE}-lipsync"]))
