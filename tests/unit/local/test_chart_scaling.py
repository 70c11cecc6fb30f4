"""The chart's autoscaling objects read as the adapter and KEDA would run them (services/local/chart_scaling.py),
on the chart's own `helm template` output."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.local.chart_scaling import (
    load_manifests,
    parse_duration_s,
    render_chart,
    save_manifests,
    scaling_objects,
    scrape_interval_s,
    speed_up,
)
from services.local.cluster import REPO_ROOT
from tests.helpers.tools import helm_binary

CHART = REPO_ROOT / "helm" / "lipline"
NS = "ns1"


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return render_chart(helm_binary(), CHART, "lipline", NS)


def test_speed_up_divides_every_range_selector() -> None:
    assert speed_up("rate(a[2m]) / rate(b[1m]) + c[30s]", 10) == "rate(a[12000ms]) / rate(b[6000ms]) + c[3000ms]"
    assert speed_up("rate(a[2m])", 1) == "rate(a[2m])"
    assert parse_duration_s("15s") == 15 and parse_duration_s("1m") == 60 and parse_duration_s("30") == 30


def test_the_render_hpa_becomes_the_adapters_external_query(docs: list[dict]) -> None:
    render = scaling_objects(docs, NS)["render"]
    queue, cpu = render.metrics
    # The adapter's externalRules query with the namespace and the HPA's selector as matchers.
    assert queue.kind == "external-average" and queue.target == 2
    assert queue.query == 'max(lipline_queue_depth{namespace="ns1",service="lipline-render",kind="segment"})'
    assert cpu.kind == "cpu" and cpu.target == 80 and render.cpu_request == 2
    assert (render.min_replicas, render.max_replicas) == (2, 16)
    assert render.behavior.down.stabilization_s == 300 and render.behavior.up.policies[1].value == 4


def test_pods_metrics_get_the_pods_of_the_hpa(docs: list[dict]) -> None:
    lipsync = scaling_objects(docs, NS, time_scale=10)["lipsync"]
    (gpu,) = lipsync.metrics
    assert gpu.kind == "pods" and gpu.target == 0.8
    assert gpu.promql(["lipline-lipsync-0", "lipline-lipsync-3"]) == (
        'avg by (pod) (avg_over_time(lipline_gpu_utilization_ratio{namespace="ns1",'
        'pod=~"lipline-lipsync-0|lipline-lipsync-3"}[6000ms]))'
    )
    # time-scaled: the chart's 600 s scale-down window and 180 s period become 60 s and 18 s
    assert lipsync.behavior.down.stabilization_s == 60 and lipsync.behavior.down.policies[0].period_s == 18


def test_keda_triggers_run_verbatim(tmp_path: Path) -> None:
    docs = render_chart(helm_binary(), CHART, "lipline", NS, ["keda.enabled=true"])
    # Saved as JSON and read back (a host with no helm and no PyYAML): the same objects.
    save_manifests(docs, tmp_path / "rendered.json")
    objects = scaling_objects(load_manifests(tmp_path / "rendered.json"), NS)
    assert objects == scaling_objects(docs, NS)
    live = objects["live"]
    assert live.kind == "ScaledObject"
    sessions, cpu = live.metrics
    assert sessions.kind == "external-value" and sessions.target == 12 and sessions.empty_is_zero
    assert 'pod=~"lipline-live-.*"' in sessions.query and cpu.kind == "cpu"
    assert scrape_interval_s(docs) == 15


def test_fractional_targets_pass_through_set_json() -> None:
    # helm --set turns 0.02 into the string "0.02", which the schema refuses; --set-json keeps a number.
    with pytest.raises(RuntimeError, match="want number"):
        render_chart(helm_binary(), CHART, "lipline", NS, ["stages.lipsync.autoscaling.target=0.02"])
    docs = render_chart(
        helm_binary(),
        CHART,
        "lipline",
        NS,
        ["stages.lipsync.autoscaling.metric=queue"],
        json_values=["stages.lipsync.autoscaling.target=0.02"],
    )
    (queue,) = scaling_objects(docs, NS)["lipsync"].metrics
    assert queue.name == "lipline_stage_queue_mean_seconds" and queue.target == pytest.approx(0.02)
