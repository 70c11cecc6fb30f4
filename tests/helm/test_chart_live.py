"""The live workers in the chart: their Deployment, how the gateway reaches them, how they scale.

Live workers (services/live) are CPU pods that hold live sessions. The gateway does not dial them
through a Service: each worker advertises its own address (its pod IP, from the downward API) in the
job store and the gateway places sessions there, so their NetworkPolicy admits the gateway through
its `reaches` trait, not `dials`. They scale on active sessions per pod (a prometheus-adapter Pods
metric, or KEDA's Prometheus trigger on the same query), and their settings must parse as the worker
parses them, with the address Kubernetes expands.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
import yaml

from services.live.settings import LiveSettings
from services.serving.settings import parse_settings
from services.serving.stages import STAGES
from tests.helm.test_chart import (
    CHART,
    PG_SECRET,
    RWX,
    _adapter_rules,
    _dashboard,
    _grpc_callers,
    _settings_classes,
    by_kind,
    container,
    env_of,
    mounts_of,
    render,
    render_fails,
    volumes_of,
)

LIVE = "lip-lipline-live"
PORT = STAGES["live"].port
# services/live/settings.py: ~40 ms of CPU per session-second at 512x512 x264 ultrafast (mel,
# compositor and encoder), and one Python process's own work (tick loops, mel, gRPC framing).
CPU_PER_SESSION = 0.040
PROCESS_CPU = 1.0
SHARED_STORES = (*PG_SECRET, *RWX, "store.local.enabled=false")


def _values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())["stages"]


def _cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def _expanded(env: dict[str, str], pod_ip: str) -> dict[str, str]:
    """The variables as the container sees them: Kubernetes expands $(POD_IP) from the downward API."""
    return {k: v.replace("$(POD_IP)", pod_ip) for k, v in env.items() if not v.startswith("field:")}


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render(*SHARED_STORES)


@pytest.fixture(scope="module")
def live(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(docs, "Deployment")[LIVE]


def test_live_workers_are_cpu_pods_sized_for_their_sessions(live: dict[str, Any]) -> None:
    c = container(live)
    env = env_of(live)
    assert c["args"] == ["python", "-m", "services.live"]
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {}) and "LIPLINE_DEVICE" not in env
    assert not live["spec"]["template"]["spec"].get("tolerations")
    # CPU: the sessions' frames and the process's own work fit in the request, with room for jitter
    # (a late frame is skipped); no CPU limit (throttling makes frames late); the encode pool is the
    # request (os.sched_getaffinity in a pod is the whole node's CPUs).
    cores = _cores(c["resources"]["requests"]["cpu"])
    sessions = int(env["LIPLINE_MAX_SESSIONS"])
    assert cores >= PROCESS_CPU + sessions * CPU_PER_SESSION, (cores, sessions)
    assert "cpu" not in c["resources"]["limits"]
    assert int(env["LIPLINE_ENCODE_THREADS"]) == math.ceil(cores)
    assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["memory"]


def test_a_live_worker_advertises_its_pod_ip_and_port(live: dict[str, Any]) -> None:
    names = [e["name"] for e in container(live)["env"]]
    env = env_of(live)
    assert env["POD_IP"] == "field:status.podIP"
    # $(POD_IP) expands only from a variable defined before it in the list.
    assert names.index("POD_IP") < names.index("LIPLINE_ADVERTISE_ADDRESS")
    assert env["LIPLINE_ADVERTISE_ADDRESS"] == f"$(POD_IP):{PORT}"
    settings = parse_settings(LiveSettings, [], environ=_expanded(env, "10.42.7.19"))
    settings.validate()
    assert settings.advertise_address == f"10.42.7.19:{settings.port}" and settings.port == PORT
    # The port it advertises is the one it serves, wherever the values move it.
    moved = env_of(by_kind(render("stages.live.port:=50070"), "Deployment")[LIVE])
    assert (moved["LIPLINE_PORT"], moved["LIPLINE_ADVERTISE_ADDRESS"]) == ("50070", "$(POD_IP):50070")


def test_only_the_stages_that_advertise_get_the_pod_ip(docs: list[dict[str, Any]]) -> None:
    advertising = {name for name, v in _values().items() if v.get("advertise")}
    assert advertising == {"live"}
    # The trait and the setting go together: a service with advertise_address is called at its own address.
    with_setting = {
        name
        for name, cls in _settings_classes().items()
        if "advertise_address" in {f.name for f in dataclasses.fields(cls)}
    }
    assert advertising == with_setting
    for name, d in by_kind(docs, "Deployment").items():
        env = env_of(d)
        assert ("LIPLINE_ADVERTISE_ADDRESS" in env) == ("POD_IP" in env) == name.endswith("-live"), name
    # The chart sets it: a value cannot.
    assert "values don't meet the specifications of the schema" in render_fails(
        "stages.live.config.advertise_address=10.0.0.1:1"
    )


def test_live_workers_use_the_stores_and_a_scratch_cache_like_render_workers(
    docs: list[dict[str, Any]], live: dict[str, Any]
) -> None:
    env, render_env = env_of(live), env_of(by_kind(docs, "Deployment")["lip-lipline-render"])
    for key in ("LIPLINE_JOB_STORE", "LIPLINE_BLOB_STORE"):
        assert env[key] == render_env[key], key
    assert env["LIPLINE_JOB_STORE"] == "secret:lipline-pg/dsn"
    assert mounts_of(live)["blobs"] == env["LIPLINE_BLOB_STORE"]
    assert volumes_of(live)["blobs"]["persistentVolumeClaim"] == {"claimName": "lipline-blobs"}
    cache = volumes_of(live)["cache"]
    assert cache["emptyDir"]["sizeLimit"] == "10Gi" and mounts_of(live)["cache"] == env["LIPLINE_CACHE_DIR"] == "/cache"
    # The avatar cache's budget stays below the volume's limit (the kubelet evicts a pod past it).
    assert int(env["LIPLINE_AVATAR_CACHE_BYTES"]) < 10 * 1024**3


def test_the_single_node_try_out_puts_live_workers_beside_the_sqlite_file() -> None:
    default = render()
    live = by_kind(default, "Deployment")[LIVE]
    assert env_of(live)["LIPLINE_JOB_STORE"] == "sqlite:////var/lib/lipline/lipline.db"
    (term,) = live["spec"]["template"]["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert LIVE not in by_kind(default, "PodDisruptionBudget")  # pinned to one node: a PDB would block its drain


def test_live_streams_outlast_the_connection_age_and_sigterm_waits_for_the_drain(live: dict[str, Any]) -> None:
    env = env_of(live)
    settings = parse_settings(LiveSettings, [], environ=_expanded(env, "10.42.7.19"))
    # The gateway's Converse streams to a worker last a whole session: an aged connection must not cut them.
    assert settings.max_connection_age_grace_s >= settings.max_session_seconds
    pod = live["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > settings.grace_s
    longer = by_kind(render("stages.live.config.grace_s:=45"), "Deployment")[LIVE]
    assert longer["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 55  # grace_s + the 10 s margin
    c = container(live)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"] == {"port": PORT}, probe
    # A rollout adds a worker before it removes one: the removed one's sessions resume on the others.
    assert live["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_only_the_gateway_calls_the_live_workers_which_call_lipsync_and_superres(
    docs: list[dict[str, Any]], live: dict[str, Any]
) -> None:
    policies = by_kind(docs, "NetworkPolicy")
    assert _grpc_callers(policies[LIVE]) == {"gateway"}
    for stage in ("lipsync", "superres"):
        assert "live" in _grpc_callers(policies[f"lip-lipline-{stage}"]), stage
    env = env_of(live)
    assert env["LIPLINE_LIPSYNC_ADDRESS"] == f"dns:///lip-lipline-lipsync.media.svc:{STAGES['lipsync'].port}"
    assert env["LIPLINE_SUPERRES_ADDRESS"] == f"dns:///lip-lipline-superres.media.svc:{STAGES['superres'].port}"
    # `reaches` gives the gateway no address variable (it finds the workers in the job store)...
    gateway_env = env_of(by_kind(docs, "Deployment")["lip-lipline-gateway"])
    assert "LIPLINE_LIVE_ADDRESS" not in gateway_env
    # ...and only a stage that advertises can be reached so.
    values = _values()
    reached = {target for v in values.values() for target in v.get("reaches", [])}
    assert reached == {name for name, v in values.items() if v.get("advertise")}
    # Without the gateway's `reaches`, nobody may call the live workers.
    alone = by_kind(render("stages.gateway.reaches:=[]"), "NetworkPolicy")
    assert _grpc_callers(alone[LIVE]) == set()


def test_live_workers_scale_on_active_sessions_per_pod(docs: list[dict[str, Any]], live: dict[str, Any]) -> None:
    hpa = by_kind(docs, "HorizontalPodAutoscaler")[LIVE]
    sessions, cpu = hpa["spec"]["metrics"]
    assert sessions["type"] == "Pods" and sessions["pods"]["metric"]["name"] == "lipline_live_sessions_active"
    assert sessions["pods"]["target"]["type"] == "AverageValue"
    target = int(sessions["pods"]["target"]["averageValue"].removesuffix("m")) / 1000
    assert 0 < target < int(env_of(live)["LIPLINE_MAX_SESSIONS"])  # room for sessions while a new pod starts
    assert cpu["resource"]["name"] == "cpu"
    assert hpa["spec"]["minReplicas"] >= 2 and "replicas" not in live["spec"]
    # Down slowly: a removed worker's sessions must all resume elsewhere.
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 600
    # The adapter's rule: the gauge's active state, per pod, so the HPA averages over the workers.
    (rule,) = [r for r in _adapter_rules()["rules"] if r["name"]["as"] == "lipline_live_sessions_active"]
    assert rule["seriesQuery"] == 'lipline_live_sessions{namespace!="",pod!="",state="active"}'
    assert 'state="active"' in rule["metricsQuery"] and "by (<<.GroupBy>>)" in rule["metricsQuery"]
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}


def test_keda_scales_live_workers_on_the_same_query() -> None:
    docs = render("keda.enabled=true", *SHARED_STORES)
    assert LIVE not in by_kind(docs, "HorizontalPodAutoscaler")
    obj = by_kind(docs, "ScaledObject")[LIVE]
    sessions, cpu = obj["spec"]["triggers"]
    assert sessions["type"] == "prometheus" and sessions["metricType"] == "Value"  # already the average over the pods
    assert (
        sessions["metadata"]["query"]
        == f'avg(avg_over_time(lipline_live_sessions{{state="active",namespace="media",pod=~"{LIVE}-.*"}}[1m]))'
    )
    assert float(sessions["metadata"]["threshold"]) == _values()["live"]["autoscaling"]["target"]
    assert cpu == {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "80"}}
    assert (
        obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
        >= 600
    )


def test_a_pdb_only_where_two_live_workers_run(docs: list[dict[str, Any]]) -> None:
    assert by_kind(docs, "PodDisruptionBudget")[LIVE]["spec"]["minAvailable"] == 1
    one = render(*SHARED_STORES, "stages.live.autoscaling.minReplicas=1")
    assert LIVE not in by_kind(one, "PodDisruptionBudget")
    fixed = render(*SHARED_STORES, "stages.live.autoscaling.enabled=false", "stages.live.replicas=3")
    assert by_kind(fixed, "Deployment")[LIVE]["spec"]["replicas"] == 3 and LIVE in by_kind(fixed, "PodDisruptionBudget")


def test_the_live_workers_have_their_dashboard_row(docs: list[dict[str, Any]]) -> None:
    dashboard = json.loads(_dashboard(docs))
    panels = dashboard["panels"]
    (row,) = [p for p in panels if p["type"] == "row" and p["title"] == "Live sessions"]
    below = [p["gridPos"]["y"] for p in panels if p["type"] == "row" and p["gridPos"]["y"] > row["gridPos"]["y"]]
    end = min(below, default=10**6)  # the next row (the musetalk tier's) ends the live one
    live = [p for p in panels if row["gridPos"]["y"] < p["gridPos"]["y"] < end]
    exprs = [t["expr"].replace(" ", "") for p in live for t in p["targets"]]
    wanted = {
        "sessions by state": "sumby(state)(lipline_live_sessions{",
        "latency p50": "histogram_quantile(0.5,sumby(le)(rate(lipline_live_frame_latency_seconds_bucket{",
        "latency p95": "histogram_quantile(0.95,sumby(le)(rate(lipline_live_frame_latency_seconds_bucket{",
        "frames by kind": "sumby(kind)(rate(lipline_live_frames_total{",
        "Clear to idle p95": "histogram_quantile(0.95,sumby(le)(rate(lipline_live_clear_seconds_bucket{",
        "admission refusals": "rate(lipline_live_admission_refused_total{",
        "face link items per message": "rate(lipline_live_link_items_per_message_bucket{",
    }
    for what, fragment in wanted.items():
        assert any(fragment in e for e in exprs), what
    # Every query is of the dashboard's namespace; ids are unique; no panel overlaps another.
    assert all('namespace="$namespace"' in e for e in exprs)
    assert len({p["id"] for p in panels}) == len(panels)
    cells = [
        (x, y)
        for p in panels
        for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
        for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells))


def test_the_values_schema_checks_the_live_traits() -> None:
    for bad in (
        "stages.gateway.reaches={nope}",
        "stages.live.advertise=sometimes",
        "stages.live.autoscaling.metric=session",
        "stages.live.config.max_sesions=8",
    ):
        assert "values don't meet the specifications of the schema" in render_fails(bad), bad
