"""The values users set: the chart-testing scenarios in ci/, the pod keys (chart-wide and per stage),
tracing, names and labels, and monitoring that installs on any cluster.

Rendered by the real helm binary and validated strictly against the Kubernetes 1.29 and 1.37
schemas, as in test_chart.py (whose helpers these are). NOTES.txt is rendered through a copy of the
chart that exposes it as a ConfigMap, since `helm template` never prints NOTES.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.test_chart import (
    CHART,
    GPU_STAGES,
    KUBE_VERSIONS,
    OPERATOR_API,
    REPO,
    STAGES,
    _gen_chart_schema,
    _set_args,
    by_kind,
    container,
    env_of,
    helm,
    render,
    render_fails,
    validate_builtin,
)

CI = sorted((CHART / "ci").glob("*-values.yaml"))
CI_IDS = [p.name for p in CI]
RUNBOOKS = REPO / "docs" / "runbooks.md"
MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}


def _gen_chart_readme() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_chart_readme", REPO / "scripts" / "gen_chart_readme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def deployments(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The stages' Deployments by stage (whatever the object names are)."""
    return {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in docs if d["kind"] == "Deployment"}


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def default_docs() -> list[dict[str, Any]]:
    return render()


# ---- ci/: the chart-testing scenarios ----


def test_the_chart_testing_scenarios_exist() -> None:
    assert {
        "default-values.yaml",
        "postgres-s3-values.yaml",
        "keda-values.yaml",
        "tracing-values.yaml",
        "gpu-pools-values.yaml",
        "monitoring-values.yaml",
    } <= set(CI_IDS)


@pytest.mark.parametrize("values", CI, ids=CI_IDS)
def test_ci_values_pass_helm_lint_strict(values: Path) -> None:
    result = helm("lint", "--strict", str(CHART), "-f", str(values), check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("operator", [True, False], ids=["with the operator API", "without"])
@pytest.mark.parametrize("values", CI, ids=CI_IDS)
def test_ci_values_render_and_validate(values: Path, operator: bool, kube_version: str) -> None:
    docs = render(values=(values,), api_versions=(OPERATOR_API,) if operator else (), kube_version=kube_version)
    assert validate_builtin(docs, kube_version) >= 12
    assert set(deployments(docs)) == set(STAGES)
    for d in deployments(docs).values():
        env_of(d)  # no variable twice
    if not operator:
        assert not MONITORING_KINDS & {d["kind"] for d in docs}


# The pod keys pass Kubernetes objects through: the key is the value, not what is inside.
POD_KEYS = set(_gen_chart_schema()._pod_keys())


def _schema_paths(node: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Every key the schema names, stages collapsed to `stages.*` (pod keys and pass-through objects are leaves)."""
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        if prefix == "stages.":
            path = "stages.*"
            yield from _schema_paths(sub, "stages.*.")
            continue
        yield path
        if key not in POD_KEYS:
            yield from _schema_paths(sub, f"{path}.")


def _set_paths(values: Any, prefix: str = "") -> Iterator[str]:
    if not isinstance(values, dict):
        return
    for key, sub in values.items():
        path = "stages.*" if prefix == "stages." else f"{prefix}{key}"
        yield path
        yield from _set_paths(sub, f"{path}.")


def test_every_key_of_the_schema_is_set_by_the_defaults_or_a_ci_scenario() -> None:
    """So every value is rendered and validated by the tests above (`global` is Helm's, not ours)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    wanted = {p for p in _schema_paths(schema) if p != "global" and not p.startswith("stages.*.autoscaling.behavior")}
    covered = set(_set_paths(yaml.safe_load((CHART / "values.yaml").read_text())))
    for values in CI:
        covered |= set(_set_paths(yaml.safe_load(values.read_text()) or {}))
    assert not wanted - covered, f"no default and no ci/*-values.yaml sets {sorted(wanted - covered)}"


# ---- monitoring that installs ----


@pytest.mark.parametrize(
    ("api_versions", "sets", "kinds"),
    [
        ((), (), set()),
        ((OPERATOR_API,), (), MONITORING_KINDS),
        ((OPERATOR_API,), ("monitoring.serviceMonitor.enabled=false",), {"PrometheusRule"}),
        ((OPERATOR_API,), ("monitoring.prometheusRule.enabled=false",), {"ServiceMonitor"}),
    ],
    ids=["no operator API: neither", "operator API: both", "ServiceMonitor off", "PrometheusRule off"],
)
def test_servicemonitor_and_prometheusrule_render_only_where_the_operator_api_is_served(
    api_versions: tuple[str, ...], sets: tuple[str, ...], kinds: set[str]
) -> None:
    docs = render(*sets, api_versions=api_versions)
    assert MONITORING_KINDS & {d["kind"] for d in docs} == kinds


def test_helm_template_without_api_versions_renders_no_operator_objects() -> None:
    """What `helm install` does on a cluster without the operator (and `helm template` by default)."""
    out = helm("template", "lip", str(CHART)).stdout
    assert "monitoring.coreos.com" not in out
    with_api = helm("template", "lip", str(CHART), "--api-versions", OPERATOR_API).stdout
    kinds = {d["kind"] for d in yaml.safe_load_all(with_api) if d}
    assert MONITORING_KINDS <= kinds


def test_the_release_label_reaches_both_monitoring_objects() -> None:
    docs = render(values=(CHART / "ci" / "monitoring-values.yaml",))
    (monitor,) = by_kind(docs, "ServiceMonitor").values()
    (rule,) = by_kind(docs, "PrometheusRule").values()
    assert monitor["metadata"]["labels"]["release"] == rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert (
        monitor["metadata"]["labels"]["scrape-tier"] == "standard" and "scrape-tier" not in rule["metadata"]["labels"]
    )
    assert rule["metadata"]["labels"]["alerting"] == "pager" and "alerting" not in monitor["metadata"]["labels"]
    assert monitor["spec"]["endpoints"][0]["interval"] == "30s"


def _alerts(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (rule,) = by_kind(docs, "PrometheusRule").values()
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}


def _runbook_sections() -> dict[str, str]:
    """docs/runbooks.md's `## ` sections by their GitHub anchor (the heading in lower case)."""
    sections = re.split(r"^## ", RUNBOOKS.read_text(), flags=re.M)[1:]
    return {s.split("\n", 1)[0].strip().lower(): s for s in sections}


def test_every_alert_has_a_runbook_url_to_its_section_of_docs_runbooks(default_docs: list[dict[str, Any]]) -> None:
    alerts = _alerts(default_docs)
    file_alerts = {
        r["alert"]
        for g in yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert set(alerts) == file_alerts and len(alerts) >= 8
    sections = _runbook_sections()
    base = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["prometheusRule"]["runbookBaseUrl"]
    assert base.endswith("docs/runbooks.md")
    for name, alert in alerts.items():
        url = alert["annotations"]["runbook_url"]
        assert url == f"{base}#{name.lower()}", name
        section = sections.get(name.lower())
        assert section is not None, f"docs/runbooks.md has no section `## {name}`"
        for part in ("**What it means.**", "**What to check.**", "**What to do.**"):
            assert part in section, (name, part)
        # The annotations of the rules file are kept as they are.
        assert alert["annotations"]["summary"] and "{{ $labels" in json.dumps(alerts) and alert["expr"]
    custom = _alerts(render(values=(CHART / "ci" / "monitoring-values.yaml",)))
    assert all(
        a["annotations"]["runbook_url"].startswith("https://wiki.example.com/lipline/runbooks.md#")
        for a in custom.values()
    )


def test_the_gpu_metrics_alert_fires_for_gpu_pods_without_nvml() -> None:
    rules = {
        r.get("alert"): r
        for g in yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())["groups"]
        for r in g["rules"]
    }
    expr = rules["LiplineGpuMetricsMissing"]["expr"]
    assert "lipline_cudnn_ok" in expr and "unless on (namespace, pod) lipline_gpu_utilization_ratio" in expr


def test_the_adapter_values_file_carries_the_adapter_rules() -> None:
    """files/prometheus-adapter-values.yaml (for the prometheus-adapter chart) = files/adapter-rules.yaml."""
    rules = yaml.safe_load((CHART / "files" / "adapter-rules.yaml").read_text())
    values = yaml.safe_load((CHART / "files" / "prometheus-adapter-values.yaml").read_text())
    assert set(values) == {"rules"} and set(values["rules"]) == {"custom", "external"}
    assert values["rules"]["custom"] == rules["rules"]
    assert values["rules"]["external"] == rules["externalRules"]


def test_the_adapter_rules_configmap_is_opt_in() -> None:
    assert not any(name.endswith("adapter-rules") for name in by_kind(render(), "ConfigMap"))
    docs = render("monitoring.adapterRules.configMap=true")
    (cm,) = [c for name, c in by_kind(docs, "ConfigMap").items() if name.endswith("adapter-rules")]
    assert yaml.safe_load(cm["data"]["config.yaml"]) == yaml.safe_load(
        (CHART / "files" / "adapter-rules.yaml").read_text()
    )


# ---- NOTES ----


def notes(tmp_path: Path, *sets: str, api_versions: tuple[str, ...] = ()) -> str:
    """NOTES.txt as `helm install` prints it, through a copy of the chart that exposes it as a ConfigMap."""
    chart = tmp_path / "lipline"
    shutil.copytree(CHART, chart)
    (chart / "files" / "NOTES.txt").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: {{ tpl (.Files.Get "files/NOTES.txt") . | quote }}\n'
    )
    args = ["template", "lip", str(chart), "-n", "media", "--show-only", "templates/zz-notes.yaml"]
    for api in api_versions:
        args += ["--api-versions", api]
    return yaml.safe_load(helm(*args, *_set_args(sets)).stdout)["data"]["notes"]


def test_notes_say_when_the_monitoring_objects_were_skipped(tmp_path: Path) -> None:
    text = notes(tmp_path)
    assert (
        "does not serve monitoring.coreos.com/v1" in text
        and "ServiceMonitor and PrometheusRule were not created" in text
    )
    assert "prometheus-adapter-values.yaml" in text


def test_notes_explain_the_release_label_until_it_is_set(tmp_path: Path) -> None:
    assert "monitoring.labels.release" in notes(tmp_path, api_versions=(OPERATOR_API,))
    labelled = notes(tmp_path / "2", "monitoring.labels.release=kps", api_versions=(OPERATOR_API,))
    assert "MONITORING" not in labelled


# ---- the pod keys ----


@pytest.fixture(scope="module")
def pools_docs() -> list[dict[str, Any]]:
    return render(values=(CHART / "ci" / "gpu-pools-values.yaml",))


def test_an_extra_env_entry_reaches_every_container_of_every_workload() -> None:
    docs = render(
        'extraEnv:=[{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]',
        'extraEnvFrom:=[{"secretRef": {"name": "site"}}]',
    )
    workloads = [d for d in docs if d["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}]
    assert len(workloads) == len(STAGES)
    for d in workloads:
        for c in pod_spec(d)["containers"] + pod_spec(d).get("initContainers", []):
            assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in c["env"], (d["metadata"]["name"], c["name"])
            assert {"secretRef": {"name": "site"}} in c["envFrom"]


def test_extra_env_replaces_a_variable_of_the_same_name_and_a_stage_adds_its_own(
    pools_docs: list[dict[str, Any]],
) -> None:
    stages = deployments(pools_docs)
    assert env_of(stages["audio"])["HTTPS_PROXY"] == "http://proxy.internal:3128"
    assert env_of(stages["render"])["HTTPS_PROXY"] == "http://render-proxy.internal:3128"  # the stage's wins
    assert env_of(stages["lipsync"])["CUDA_MODULE_LOADING"] == "LAZY" and "CUDA_MODULE_LOADING" not in env_of(
        stages["superres"]
    )
    # A chart variable replaced by the user's: one entry, the user's value.
    docs = render('stages.gateway.extraEnv:=[{"name": "LIPLINE_LOG_LEVEL", "value": "DEBUG"}]')
    assert env_of(deployments(docs)["gateway"])["LIPLINE_LOG_LEVEL"] == "DEBUG"
    assert env_of(deployments(docs)["audio"])["LIPLINE_LOG_LEVEL"] == "INFO"
    # envFrom, volumes and mounts: chart-wide then the stage's.
    render_c = container(stages["render"])
    assert [e.get("configMapRef", e.get("secretRef"))["name"] for e in render_c["envFrom"]] == [
        "lipline-site",
        "lipline-render-extra",
    ]
    assert {"name": "fonts", "mountPath": "/usr/share/fonts/extra"} in render_c["volumeMounts"]
    for stage, d in stages.items():
        assert {"name": "ca-bundle", "mountPath": "/etc/ssl/corporate", "readOnly": True} in container(d)[
            "volumeMounts"
        ], stage
        assert {"name": "ca-bundle", "configMap": {"name": "corporate-ca"}} in pod_spec(d)["volumes"], stage
        assert ("fonts" in {v["name"] for v in pod_spec(d)["volumes"]}) == (stage == "render")


def test_a_stages_node_selector_and_tolerations_replace_the_gpu_ones(pools_docs: list[dict[str, Any]]) -> None:
    stages = deployments(pools_docs)
    assert pod_spec(stages["lipsync"])["nodeSelector"] == {"gpu-pool": "h200"}
    assert pod_spec(stages["superres"])["nodeSelector"] == {"gpu-pool": "l4"}
    assert pod_spec(stages["lipsync"])["tolerations"] == [
        {"key": "gpu-pool", "operator": "Equal", "value": "h200", "effect": "NoSchedule"}
    ]
    assert pod_spec(stages["superres"])["tolerations"][0]["value"] == "l4"
    # The CPU stages keep the chart-wide ones, without the GPU ones.
    assert pod_spec(stages["audio"])["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod_spec(stages["audio"])["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "media", "effect": "NoSchedule"}
    ]
    # Runtime class and GPU resource per pool.
    assert (
        pod_spec(stages["lipsync"])["runtimeClassName"] == "nvidia-cdi"
        and pod_spec(stages["superres"])["runtimeClassName"] == "nvidia"
    )
    assert container(stages["superres"])["resources"]["limits"]["nvidia.com/gpu.shared"] == 1
    assert "nvidia.com/gpu.shared" not in container(stages["superres"])["resources"].get("requests", {})
    assert container(stages["lipsync"])["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "runtimeClassName" not in pod_spec(stages["audio"])


def test_without_stage_values_gpu_stages_get_the_chart_wide_and_gpu_placement() -> None:
    docs = render(
        "nodeSelector.zone=a", "gpu.nodeSelector.gpu=yes", 'tolerations:=[{"key": "x", "operator": "Exists"}]'
    )
    stages = deployments(docs)
    for stage in GPU_STAGES:
        assert pod_spec(stages[stage])["nodeSelector"] == {"zone": "a", "gpu": "yes"}
        assert [t["key"] for t in pod_spec(stages[stage])["tolerations"]] == ["x", "nvidia.com/gpu"]
    assert pod_spec(stages["audio"])["nodeSelector"] == {"zone": "a"}
    assert [t["key"] for t in pod_spec(stages["audio"])["tolerations"]] == ["x"]


def test_affinity_spread_priority_and_pod_metadata(pools_docs: list[dict[str, Any]]) -> None:
    stages = deployments(pools_docs)
    superres, audio, render_d = pod_spec(stages["superres"]), pod_spec(stages["audio"]), pod_spec(stages["render"])
    assert set(superres["affinity"]) == {"podAntiAffinity"}  # the stage's replaces the chart-wide
    assert set(audio["affinity"]) == {"nodeAffinity"}
    assert set(render_d["affinity"]) == {"nodeAffinity", "podAffinity"}  # plus the local store's term
    for stage, d in stages.items():
        (spread,) = pod_spec(d)["topologySpreadConstraints"]
        selector = d["spec"]["selector"]["matchLabels"]
        assert spread["labelSelector"] == {"matchLabels": selector}, stage  # filled in per stage
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items() and labels["tier"] == "backend" and labels["team"] == "media"
        annotations = d["spec"]["template"]["metadata"]["annotations"]
        assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"
    assert pod_spec(stages["superres"])["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert stages["lipsync"]["spec"]["template"]["metadata"]["labels"]["gpu-pool"] == "h200"
    assert stages["lipsync"]["spec"]["template"]["metadata"]["annotations"]["lipline.io/pool"] == "h200"
    assert pod_spec(stages["lipsync"])["priorityClassName"] == "lipline-gpu"
    assert audio["priorityClassName"] == "lipline-standard"


def test_probes_and_update_strategy(pools_docs: list[dict[str, Any]]) -> None:
    stages = deployments(pools_docs)
    lipsync, audio = container(stages["lipsync"]), container(stages["audio"])
    assert lipsync["startupProbe"]["periodSeconds"] == 10 and lipsync["startupProbe"]["failureThreshold"] == 90
    assert audio["startupProbe"]["failureThreshold"] == 120 // 5  # startupSeconds / periodSeconds
    assert audio["readinessProbe"] == {
        "grpc": {"port": 50061},
        "periodSeconds": 5,
        "timeoutSeconds": 2,
        "failureThreshold": 2,
    }
    assert audio["livenessProbe"] == {
        "grpc": {"port": 50061},
        "periodSeconds": 10,
        "timeoutSeconds": 10,
        "failureThreshold": 3,
    }
    assert stages["lipsync"]["spec"]["strategy"] == {"type": "Recreate"}
    assert stages["audio"]["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0},
    }
    defaults = deployments(render())
    assert defaults["lipsync"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert defaults["audio"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 1}


def test_termination_grace_follows_each_stages_drain_time(pools_docs: list[dict[str, Any]]) -> None:
    for docs, margin in ((render(), 10), (pools_docs, 15)):
        for stage, d in deployments(docs).items():
            grace = float(env_of(d)["LIPLINE_GRACE_S"])  # the stage's own grace_s, else commonConfig's
            assert pod_spec(d)["terminationGracePeriodSeconds"] == math.ceil(grace) + margin, stage
    assert env_of(deployments(pools_docs)["superres"])["LIPLINE_GRACE_S"] == "40.5"
    assert pod_spec(deployments(pools_docs)["superres"])["terminationGracePeriodSeconds"] == 41 + 15


def test_one_retention_value_reaches_the_gateway_and_the_render_workers() -> None:
    for docs, ttl in ((render(), "604800"), (render("store.outputTtlSeconds=3600"), "3600")):
        for stage in ("gateway", "render"):
            assert env_of(deployments(docs)[stage])["LIPLINE_OUTPUT_TTL_S"] == ttl, stage
        assert "LIPLINE_OUTPUT_TTL_S" not in env_of(deployments(docs)["live"])  # stores, but no outputs


def test_name_overrides_and_common_labels() -> None:
    docs = render("fullnameOverride=media-lipsync", "commonLabels.team=media")
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"} == {f"media-lipsync-{s}" for s in STAGES}
    for doc in docs:
        assert doc["metadata"]["labels"]["team"] == "media", (doc["kind"], doc["metadata"]["name"])
    gateway = deployments(docs)["gateway"]
    assert (
        env_of(deployments(docs)["render"])["LIPLINE_LIPSYNC_ADDRESS"] == "dns:///media-lipsync-lipsync.media.svc:50062"
    )
    assert "team" not in gateway["spec"]["selector"]["matchLabels"]
    named = render("nameOverride=talkinghead")
    assert {d["metadata"]["labels"]["app.kubernetes.io/name"] for d in named} == {"talkinghead"}
    assert "lip-talkinghead-audio" in by_kind(named, "Deployment")


# ---- tracing ----


def test_tracing_values_become_the_standard_otel_variables() -> None:
    docs = render(values=(CHART / "ci" / "tracing-values.yaml",))
    for stage, d in deployments(docs).items():
        env = env_of(d)
        assert env["OTEL_SDK_DISABLED"] == "false" and env["OTEL_TRACES_EXPORTER"] == "otlp"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability.svc:4318"
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
        assert env["OTEL_TRACES_SAMPLER"] == "parentbased_always_on" and "OTEL_TRACES_SAMPLER_ARG" not in env
        assert env["OTEL_SERVICE_NAME"] == f"lipline-{stage}"
        assert env["K8S_POD_NAME"] == "field:metadata.name"
        attributes = dict(kv.split("=", 1) for kv in env["OTEL_RESOURCE_ATTRIBUTES"].split(","))
        assert attributes == {
            "k8s.namespace.name": "media",
            "k8s.pod.name": "$(K8S_POD_NAME)",
            "k8s.deployment.name": d["metadata"]["name"],
            "service.version": "0.1.0",
            "deployment.environment.name": "staging",
            "team": "media",
        }
        # K8S_POD_NAME is defined before the variable that refers to it (Kubernetes expands in order).
        names = [e["name"] for e in container(d)["env"]]
        assert names.index("K8S_POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")
        assert env["OTEL_EXPORTER_OTLP_HEADERS"] == "secret:otlp-auth/headers"


def test_tracing_disabled_turns_the_sdk_off_and_sampler_arg_passes_through() -> None:
    for d in deployments(render()).values():
        otel = {k: v for k, v in env_of(d).items() if k.startswith("OTEL_")}
        assert otel == {"OTEL_SDK_DISABLED": "true"}
    docs = render("tracing.enabled=true", "tracing.endpoint=http://collector:4317")
    env = env_of(deployments(docs)["lipsync"])
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio" and env["OTEL_TRACES_SAMPLER_ARG"] == "0.1"


def test_tracing_enabled_without_an_endpoint_fails_with_a_clear_message() -> None:
    assert "tracing.enabled needs tracing.endpoint" in render_fails("tracing.enabled=true")


# ---- the schema ----


@pytest.mark.parametrize(
    "bad",
    [
        "extraEnv[0].nme=X",
        'extraEnv:=[{"value": "no name"}]',
        'extraEnvFrom:=[{"secretReff": {"name": "x"}}]',
        'extraVolumeMounts:=[{"name": "x"}]',
        'extraVolumeMounts:=[{"name": "x", "mountPath": "/x", "readonly": true}]',
        'extraVolumes:=[{"name": "x"}]',
        "nodeSelector.pool:=1",
        'tolerations:=[{"key": "x", "operator": "Exist"}]',
        "affinity.nodeAfinity.x=1",
        'topologySpreadConstraints:=[{"maxSkew": 1, "topologyKey": "zone"}]',
        "priorityClassName:=5",
        "updateStrategy.type=BlueGreen",
        "updateStrategy.rollingUpdate.maxSurgee=1",
        "probes.liveness.timeoutSecond=5",
        "probes.readiness.periodSeconds:=0",
        "probes.startupp.periodSeconds=5",
        "terminationGraceMarginSeconds:=-1",
        "nameOverride=Not_A_Name",
        "commonLabels.app\\.kubernetes\\.io/name=x",
        "podLabels.app\\.kubernetes\\.io/component=x",
        "tracing.enable=true",
        "tracing.protocol=http",
        "tracing.sampler=sometimes",
        "tracing.endpoint=collector:4317",
        "tracing.resourceAttributes.a\\,b=c",
        "monitoring.labell.release=x",
        "monitoring.prometheusRule.runbookBaseUrl=docs/runbooks.md",
        "monitoring.adapterRules.enabled=true",
        "monitoring.serviceMonitor.interval=often",
        "stages.lipsync.nodeSelectr.pool=a",
        "stages.lipsync.extraEnv[0].nme=X",
        "stages.superres.gpuResourceNmae=x",
        "stages.render.probes.liveness.timeoutSecs=3",
        "stages.gateway.podLabels.app\\.kubernetes\\.io/instance=x",
        "stages.audio.updateStrategy.type=Rolling",
        "stages.lipsync.priorityClass=x",
    ],
)
def test_a_typo_in_a_new_value_fails_the_schema(bad: str) -> None:
    stderr = render_fails(bad)
    assert "values don't meet the specifications of the schema" in stderr, (bad, stderr)


def test_values_yaml_comments_generate_the_readme() -> None:
    readme = (CHART / "README.md").read_text()
    assert readme == _gen_chart_readme().render(readme), (
        "helm/lipline/README.md is stale: run `python scripts/gen_chart_readme.py`"
    )


def test_the_readme_documents_every_value_and_every_stage_key() -> None:
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in values:
        assert f"| `{key}" in readme, key
    schema = _gen_chart_schema().build()
    for key in next(iter(schema["properties"]["stages"]["properties"].values()))["properties"]:
        assert f"| `{key}` |" in readme, key
    for key in ("extraEnv", "nodeSelector", "tolerations", "runtimeClassName", "probes"):
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{key}` |"))
        assert row.split("|")[-2].strip(), f"{key}: no description"


def test_the_readme_generator_reads_comment_blocks_not_list_items() -> None:
    gen = _gen_chart_readme()
    text = (
        "# The block.\n# Two lines.\nblock:\n  # A leaf.\n  leaf: 1\n  items:\n    # not a key\n    - a: 1\n      b: 2\n"
        "  # After.\n  after: x\n\n# Spaced.\n\nlone: 2\n"
    )
    found = gen.comments(text)
    assert found == {
        "block": ["The block.", "Two lines."],
        "block.leaf": ["A leaf."],
        "block.items": [],
        "block.after": ["After."],
        "lone": [],
    }


def test_helm_package_includes_the_readme_and_the_adapter_values(tmp_path: Path) -> None:
    helm("package", str(CHART), "-d", str(tmp_path))
    (package,) = tmp_path.glob("lipline-*.tgz")
    with tarfile.open(package) as tgz:
        names = set(tgz.getnames())
    for path in (
        "README.md",
        "values.schema.json",
        "files/prometheus-adapter-values.yaml",
        "files/prometheus-rules.yaml",
        "ci/gpu-pools-values.yaml",
        "templates/NOTES.txt",
    ):
        assert f"lipline/{path}" in names, path


def test_the_helm_test_pod_follows_the_chart_wide_placement_not_the_gpu_one(pools_docs: list[dict[str, Any]]) -> None:
    (pod,) = by_kind(pools_docs, "Pod").values()
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert [t["key"] for t in pod["spec"]["tolerations"]] == ["dedicated"]
    assert pod["metadata"]["labels"]["team"] == "media"  # commonLabels
    (default_pod,) = by_kind(render(), "Pod").values()
    assert "nodeSelector" not in default_pod["spec"] and "tolerations" not in default_pod["spec"]
