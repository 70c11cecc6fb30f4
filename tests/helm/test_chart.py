"""The Helm chart, rendered by a real helm binary and every manifest checked against the Kubernetes schemas.

`helm lint` and `helm template` run for real (the binary scripts/install_helm.py puts in .venv/bin);
every rendered object of a built-in kind is validated strictly (unknown fields rejected) against
the Kubernetes 1.29 OpenAPI schemas bundled with kubernetes-validate; the prometheus-operator
objects are checked for what Prometheus needs from them. Then what matters to an operator: GPU
requests, probes, non-root read-only pods, HPAs on the adapter's metrics, network isolation, and
that every LIPLINE_* variable the chart sets is a setting the service really has.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.helpers.tools import helm_binary

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "lipline"
KUBE_VERSION = "1.29.0"
GPU_STAGES = ("lipsync", "superres")
STAGES = ("audio", "lipsync", "superres", "gateway")


def _gen_chart_schema() -> Any:
    """scripts/gen_chart_schema.py, which writes values.schema.json from the services' settings."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gen_chart_schema
    finally:
        sys.path.pop(0)
    return gen_chart_schema


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/lipline-helm/cache", "HELM_CONFIG_HOME": "/tmp/lipline-helm/config",
           "HELM_DATA_HOME": "/tmp/lipline-helm/data"}
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=60, check=check, env=env)


def render(*sets: str, release: str = "lip") -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", "media", "--kube-version", KUBE_VERSION]
    for s in sets:  # "key=value"; "key:=json" for numbers --set would pass as strings
        args += ["--set-json", s.replace(":=", "=", 1)] if ":=" in s else ["--set", s]
    out = helm(*args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def env_of(deployment: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(deployment)["env"]}


VARIANTS = {
    "defaults": (),
    "with volumes, no autoscaling, no monitoring": (
        "models.existingClaim=lipline-models", "compileCache.existingClaim=lipline-compile-cache",
        "stages.gateway.storage.existingClaim=lipline-data", "stages.lipsync.autoscaling.enabled=false",
        "stages.superres.autoscaling.enabled=false", "stages.audio.autoscaling.enabled=false",
        "monitoring.serviceMonitor.enabled=false", "monitoring.prometheusRule.enabled=false",
        "networkPolicy.enabled=false", "gpu.runtimeClassName=nvidia",
    ),
    "KEDA": ("keda.enabled=true", "stages.superres.autoscaling.metric=queue", "stages.lipsync.autoscaling.minReplicas=2"),
    "queue-time autoscaling, gateway LoadBalancer": (
        "stages.lipsync.autoscaling.metric=queue", "stages.lipsync.autoscaling.target:=0.05",
        "stages.gateway.service.type=LoadBalancer", "stages.gateway.autoscaling.enabled=true",
    ),
}


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(*VARIANTS[request.param])


@pytest.fixture(scope="module")
def default_docs() -> list[dict[str, Any]]:
    return render()


def test_helm_lint_passes_strict() -> None:
    result = helm("lint", "--strict", str(CHART), check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_builtin_manifest_matches_the_kubernetes_schema(rendered: list[dict[str, Any]]) -> None:
    checked = 0
    for doc in rendered:
        if doc["apiVersion"].startswith(("monitoring.coreos.com/", "keda.sh/")):
            continue  # CRDs: not in the core schemas, checked below
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
        checked += 1
    assert checked >= 10


def test_the_validator_rejects_a_broken_manifest(default_docs: list[dict[str, Any]]) -> None:
    """The schema check above could fail: a wrong type in a rendered Deployment is caught."""
    deployment = next(d for d in default_docs if d["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["revisionHistoryLimit"] = "five"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSION, strict=True)


def test_values_schema_rejects_bad_values() -> None:
    for bad in ("stages.lipsync.autoscaling.metric=memory", "stages.lipsync.gpu=-1", "image.pullPolicy=Sometimes",
                "stages.superres.port=70000", "stages.lipsync.config.no_such_setting=1",
                "monitoring.serviceMonitor.enabeld=false", "stages.lipsync.pdb.minAvailabel=1"):
        result = helm("template", "x", str(CHART), "--set", bad, check=False)
        assert result.returncode != 0, f"--set {bad} was accepted"
        assert "values don't meet the specifications of the schema" in result.stderr, result.stderr


def test_gpu_stages_request_gpus_and_land_on_gpu_nodes(default_docs: list[dict[str, Any]]) -> None:
    deployments = by_kind(default_docs, "Deployment")
    for stage in STAGES:
        d = deployments[f"lip-lipline-{stage}"]
        limits = container(d)["resources"].get("limits", {})
        tolerations = d["spec"]["template"]["spec"].get("tolerations", [])
        if stage in GPU_STAGES:
            assert limits["nvidia.com/gpu"] == 1
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
            assert env_of(d)["LIPLINE_DEVICE"] == "cuda"
            assert d["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
        else:
            assert "nvidia.com/gpu" not in limits and not tolerations


def test_pods_run_non_root_read_only_with_native_grpc_probes(default_docs: list[dict[str, Any]]) -> None:
    for name, d in by_kind(default_docs, "Deployment").items():
        pod = d["spec"]["template"]["spec"]
        c = container(d)
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, name
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], name
        assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"]), f"{name}: no writable /tmp"
        grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"]["port"] == grpc_port, (name, probe)
        # The service drains for grace_s after SIGTERM; Kubernetes must wait at least that long.
        assert pod["terminationGracePeriodSeconds"] > int(env_of(d)["LIPLINE_GRACE_S"])


def test_gateway_dials_every_stage_through_its_headless_service(default_docs: list[dict[str, Any]]) -> None:
    services = by_kind(default_docs, "Service")
    env = env_of(by_kind(default_docs, "Deployment")["lip-lipline-gateway"])
    for stage in ("audio", "lipsync", "superres"):
        svc = services[f"lip-lipline-{stage}"]
        assert svc["spec"]["clusterIP"] == "None"  # one address per pod: client-side round-robin
        port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc")
        assert env[f"LIPLINE_{stage.upper()}_ADDRESS"] == f"dns:///lip-lipline-{stage}.media.svc:{port}"
    assert services["lip-lipline-gateway"]["spec"]["type"] == "ClusterIP"
    # Jobs live in one gateway's memory: a reconnecting client must land on the same one.
    assert services["lip-lipline-gateway"]["spec"]["sessionAffinity"] == "ClientIP"


def _settings_classes() -> dict[str, type]:
    return _gen_chart_schema().settings_classes()


def test_every_lipline_variable_is_a_real_setting_of_its_service(rendered: list[dict[str, Any]]) -> None:
    classes = _settings_classes()
    for stage, cls in classes.items():
        fields = {f"LIPLINE_{f.name.upper()}" for f in dataclasses.fields(cls)}
        d = by_kind(rendered, "Deployment")[f"lip-lipline-{stage}"]
        unknown = {k for k in env_of(d) if k.startswith("LIPLINE_")} - fields
        assert not unknown, f"{stage}: the chart sets {sorted(unknown)}, which the service does not read"


def test_the_chart_settings_parse_as_the_services_would(default_docs: list[dict[str, Any]]) -> None:
    from services.common.config import parse_settings

    for stage, cls in _settings_classes().items():
        env = env_of(by_kind(default_docs, "Deployment")[f"lip-lipline-{stage}"])
        settings = parse_settings(cls, [], environ=env)
        assert settings.port == int(env["LIPLINE_PORT"])


def test_checkpoints_are_only_configured_with_a_models_volume() -> None:
    without = by_kind(render(), "Deployment")
    assert "LIPLINE_CHECKPOINT" not in env_of(without["lip-lipline-lipsync"])
    with_models = by_kind(render("models.existingClaim=weights"), "Deployment")
    assert env_of(with_models["lip-lipline-lipsync"])["LIPLINE_CHECKPOINT"] == "/models/wav2lip.pth"
    mounts = container(with_models["lip-lipline-superres"])["volumeMounts"]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in mounts
    moved = by_kind(render("models.existingClaim=weights", "models.mountPath=/weights/"), "Deployment")
    assert env_of(moved["lip-lipline-superres"])["LIPLINE_CHECKPOINT"] == "/weights/realesr-general-x4v3.pth"


def test_hpas_scale_gpu_stages_on_the_adapters_metrics(rendered: list[dict[str, Any]]) -> None:
    hpas = by_kind(rendered, "HorizontalPodAutoscaler")
    deployments = by_kind(rendered, "Deployment")
    adapter = yaml.safe_load((CHART / "files" / "adapter-rules.yaml").read_text())
    served = {rule["name"]["as"] for rule in adapter["rules"]}
    for name, hpa in hpas.items():
        target = hpa["spec"]["scaleTargetRef"]["name"]
        assert target in deployments and "replicas" not in deployments[target]["spec"], name
        for metric in hpa["spec"]["metrics"]:
            if metric["type"] == "Pods":
                assert metric["pods"]["metric"]["name"] in served, name
        assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300


def _replica_floor(docs: list[dict[str, Any]], name: str) -> int:
    """The fewest replicas a stage runs: its HPA's or ScaledObject's minimum, else its fixed count."""
    if name in (hpas := by_kind(docs, "HorizontalPodAutoscaler")):
        return hpas[name]["spec"]["minReplicas"]
    if name in (scaled := by_kind(docs, "ScaledObject")):
        return scaled[name]["spec"]["minReplicaCount"]
    return by_kind(docs, "Deployment")[name]["spec"]["replicas"]


def test_gpu_stages_autoscale_on_a_pods_metric_by_default(default_docs: list[dict[str, Any]]) -> None:
    hpas = by_kind(default_docs, "HorizontalPodAutoscaler")
    for stage in GPU_STAGES:
        (metric,) = hpas[f"lip-lipline-{stage}"]["spec"]["metrics"]
        assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == "lipline_gpu_utilization_ratio"


def test_pdbs_never_pin_a_single_replica(rendered: list[dict[str, Any]]) -> None:
    for name, pdb in by_kind(rendered, "PodDisruptionBudget").items():
        assert _replica_floor(rendered, name) > pdb["spec"]["minAvailable"], name


def test_keda_replaces_the_hpas_of_the_gpu_stages() -> None:
    docs = render(*VARIANTS["KEDA"])
    scaled = by_kind(docs, "ScaledObject")
    hpas = by_kind(docs, "HorizontalPodAutoscaler")
    assert set(scaled) == {"lip-lipline-lipsync", "lip-lipline-superres"}
    assert set(hpas) == {"lip-lipline-audio"}  # CPU-scaled: a plain HPA, KEDA not needed
    deployments = by_kind(docs, "Deployment")
    for name, obj in scaled.items():
        assert obj["spec"]["scaleTargetRef"]["name"] in deployments and "replicas" not in deployments[name]["spec"]
        (trigger,) = obj["spec"]["triggers"]
        assert trigger["type"] == "prometheus" and float(trigger["metadata"]["threshold"]) > 0
        assert f'pod=~"{name}-.*"' in trigger["metadata"]["query"] and 'namespace="media"' in trigger["metadata"]["query"]
    assert "lipline_stage_queue_seconds_sum" in scaled["lip-lipline-superres"]["spec"]["triggers"][0]["metadata"]["query"]
    assert "PodDisruptionBudget" in {d["kind"] for d in docs}  # lipsync keeps 2 replicas: it gets a PDB


def test_stages_accept_grpc_only_from_the_gateway(default_docs: list[dict[str, Any]]) -> None:
    policies = by_kind(default_docs, "NetworkPolicy")
    for stage in ("audio", "lipsync", "superres"):
        grpc_rule = next(r for r in policies[f"lip-lipline-{stage}"]["spec"]["ingress"] if r["ports"][0]["port"] == "grpc")
        (peer,) = grpc_rule["from"]
        assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"


def test_servicemonitor_scrapes_every_stage_metrics_port(default_docs: list[dict[str, Any]]) -> None:
    (monitor,) = by_kind(default_docs, "ServiceMonitor").values()
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["endpoints"]
    matched = [s for s in by_kind(default_docs, "Service").values()
               if selector.items() <= s["metadata"]["labels"].items()]
    assert len(matched) == len(STAGES)
    for svc in matched:
        assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}


def _rule_expressions() -> Iterator[str]:
    rules = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            yield rule["expr"]


def test_alerts_and_dashboards_use_metrics_the_services_export(default_docs: list[dict[str, Any]]) -> None:
    import re

    from services.common.metrics import Metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    exported = {family.name + suffix for family in Metrics("any").registry.collect()
                for suffix in suffixes.get(family.type, ("",))}
    # GpuCollector's families exist only where NVML sees a GPU.
    exported |= {"lipline_gpu_utilization_ratio", "lipline_gpu_memory_used_bytes", "lipline_gpu_memory_total_bytes",
                 "lipline_gpu_power_watts"}
    (rule,) = by_kind(default_docs, "PrometheusRule").values()
    assert rule["spec"]["groups"]
    dashboards = [d for d in by_kind(default_docs, "ConfigMap").values() if "lipline-overview.json" in d.get("data", {})]
    texts = list(_rule_expressions()) + [dashboards[0]["data"]["lipline-overview.json"]]
    used = {m for text in texts for m in re.findall(r"\blipline_[a-z_]+", text)}
    missing = sorted(m for m in used if m not in exported)
    assert not missing, f"rules/dashboards query metrics nobody exports: {missing}"


def test_helm_test_hook_runs_the_smoke_check_against_the_gateway(default_docs: list[dict[str, Any]]) -> None:
    (pod,) = by_kind(default_docs, "Pod").values()
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    args = pod["spec"]["containers"][0]["args"]
    assert args[:3] == ["python", "-m", "services.gateway.smoke"]
    assert "--address=lip-lipline-gateway:50051" in args


def test_values_schema_is_generated_from_the_services_settings() -> None:
    assert (CHART / "values.schema.json").read_text() == _gen_chart_schema().render(), (
        "values.schema.json is stale: run `python scripts/gen_chart_schema.py`"
    )


def test_promtool_accepts_the_chart_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (Debian package 'prometheus'; bash scripts/install.sh installs it)")
    rules = CHART / "files" / "prometheus-rules.yaml"
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(group["rules"]) for group in yaml.safe_load(rules.read_text())["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout
