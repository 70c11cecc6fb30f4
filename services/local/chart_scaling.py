"""The chart's own autoscaling objects, read from `helm template`, as queries the local autoscaler runs.

What a cluster's controllers would do with the rendered chart, without them:

- an HPA's Pods metric is served by prometheus-adapter: the custom rule named like the metric, its
  `metricsQuery` with `<<.Series>>`, `<<.LabelMatchers>>` (the namespace and `pod=~` the HPA's pods)
  and `<<.GroupBy>>` (`pod`) filled in, one value per pod;
- an External metric: the external rule of that name, its matchers the namespace and the HPA's
  `selector.matchLabels`; every series it returns is summed;
- a Resource (cpu) metric: the pods' CPU use over the last sync period against the Deployment's
  request, what metrics-server reports;
- a KEDA ScaledObject: its triggers' queries as written (KEDA sends them verbatim, an empty result
  reads 0), `metricType` Value or AverageValue, its `cpu` trigger as a Resource metric, and the HPA
  KEDA creates gets the ScaledObject's behavior and replica bounds.

`time_scale` > 1 runs the same rules faster (CI): every range selector (`[1m]`), stabilization window,
policy period, the sync period and the scrape interval are divided by it; targets are not.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.local.hpa import Behavior

__all__ = [
    "HPA_SYNC_PERIOD_S",
    "MetricSpec",
    "ScalingObject",
    "load_manifests",
    "render_chart",
    "save_manifests",
    "scaling_objects",
    "scrape_interval_s",
    "speed_up",
]

#: kube-controller-manager's --horizontal-pod-autoscaler-sync-period default
HPA_SYNC_PERIOD_S = 15.0
_RANGE = re.compile(r"\[(\d+)([smh])\]")
_UNITS = {"s": 1, "m": 60, "h": 3600}


def speed_up(query: str, time_scale: float) -> str:
    """Every `[Nm]`-style range selector divided by `time_scale` (in ms: `[1m]` / 10 = `[6000ms]`)."""
    if time_scale == 1:
        return query
    return _RANGE.sub(lambda m: f"[{round(int(m[1]) * _UNITS[m[2]] * 1000 / time_scale)}ms]", query)


def parse_duration_s(text: str) -> float:
    """`15s`, `1m`, `30` (seconds) -> seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", str(text).strip())
    if not m:
        raise ValueError(f"unreadable duration {text!r}")
    return float(m[1]) * _UNITS.get(m[2] or "s", 1)


def _quantity(value: Any) -> float:
    """A Kubernetes quantity: `2`, `500m`, `2500m` -> 2.0, 0.5, 2.5."""
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


@dataclass(frozen=True)
class MetricSpec:
    """One metric of an HPA, and how to get its value from Prometheus.

    Attributes:
        kind: `pods` (per pod, AverageValue), `external-average` (sum / replicas, AverageValue),
            `external-value` (the value, Value), `cpu` (utilisation of the request, percent).
        name: the metric's name as the HPA knows it.
        target: averageValue, value or averageUtilization (percent).
        query: PromQL; for `pods` with `{pods}` standing for the pod name regexp ("" for cpu).
        empty_is_zero: an empty result reads 0 (KEDA's ignoreNullValues) instead of "no metric".
    """

    kind: str
    name: str
    target: float
    query: str = ""
    empty_is_zero: bool = False

    def promql(self, pods: Sequence[str]) -> str:
        """The query for these pods (pod names are DNS labels: nothing in them needs escaping)."""
        return self.query.replace("{pods}", "|".join(pods) or "^$")


@dataclass(frozen=True)
class ScalingObject:
    """One stage's autoscaler as the chart renders it (an HPA, or KEDA's ScaledObject)."""

    stage: str
    deployment: str
    kind: str
    min_replicas: int
    max_replicas: int
    behavior: Behavior
    metrics: tuple[MetricSpec, ...]
    #: the Deployment's CPU request per pod, cores (the CPU metric's denominator)
    cpu_request: float


def render_chart(
    helm: str,
    chart: Path,
    release: str,
    namespace: str,
    values: Sequence[str] = (),
    timeout_s: float = 120,
    json_values: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """`helm template` with the monitoring API present (ServiceMonitor) and the adapter rules' ConfigMap on.

    `values` go through `--set`, `json_values` through `--set-json`: helm's `--set` reads `0.2` as the
    string "0.2" (only integers become numbers), which the chart's schema refuses for a target."""
    cmd = [
        helm,
        "template",
        release,
        str(chart),
        "--namespace",
        namespace,
        "--api-versions",
        "monitoring.coreos.com/v1",
        "--set",
        "monitoring.adapterRules.configMap=true",
    ]
    for value in values:
        cmd += ["--set", value]
    for value in json_values:
        cmd += ["--set-json", value]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"helm template failed ({out.returncode}): {out.stderr.strip()}")
    import yaml

    return [d for d in yaml.safe_load_all(out.stdout) if d]


def save_manifests(docs: Sequence[Mapping[str, Any]], path: Path) -> None:
    """The rendered objects as JSON, the adapter rules' config.yaml as JSON too: a machine with no
    helm (and no PyYAML) reads them with `load_manifests`."""
    out = []
    for doc in docs:
        if doc.get("kind") == "ConfigMap" and doc["metadata"]["name"].endswith("-adapter-rules"):
            doc = {**doc, "data": {"config.yaml": json.dumps(_parse(doc["data"]["config.yaml"]))}}
        out.append(doc)
    path.write_text(json.dumps(out))


def load_manifests(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())


def _parse(text: str) -> Any:
    """JSON (what save_manifests writes), else YAML."""
    try:
        return json.loads(text)
    except ValueError:
        import yaml

        return yaml.safe_load(text)


def _kind(docs: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def scrape_interval_s(docs: Sequence[Mapping[str, Any]]) -> float:
    """The rendered ServiceMonitor's endpoint interval."""
    (monitor,) = _kind(docs, "ServiceMonitor")
    return parse_duration_s(monitor["spec"]["endpoints"][0]["interval"])


def _adapter_rules(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    for cm in _kind(docs, "ConfigMap"):
        if cm["metadata"]["name"].endswith("-adapter-rules"):
            return _parse(cm["data"]["config.yaml"])
    raise ValueError("the rendered chart has no adapter rules ConfigMap (monitoring.adapterRules.configMap)")


def _adapter_query(rule: Mapping[str, Any], matchers: str) -> str:
    series = rule["seriesQuery"].split("{", 1)[0].strip().strip("'\"")
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", "pod")
    )


def _hpa_metrics(hpa: Mapping[str, Any], rules: Mapping[str, Any], namespace: str, scale: float) -> list[MetricSpec]:
    custom = {r["name"]["as"]: r for r in rules.get("rules", ())}
    external = {r["name"]["as"]: r for r in rules.get("externalRules", ())}
    found = []
    for m in hpa["spec"]["metrics"]:
        if m["type"] == "Resource":
            found.append(MetricSpec("cpu", m["resource"]["name"], float(m["resource"]["target"]["averageUtilization"])))
        elif m["type"] == "Pods":
            name = m["pods"]["metric"]["name"]
            matchers = f'namespace="{namespace}",pod=~"{{pods}}"'
            query = speed_up(_adapter_query(custom[name], matchers), scale)
            found.append(MetricSpec("pods", name, _quantity(m["pods"]["target"]["averageValue"]), query))
        elif m["type"] == "External":
            name = m["external"]["metric"]["name"]
            labels = m["external"]["metric"].get("selector", {}).get("matchLabels", {})
            matchers = ",".join([f'namespace="{namespace}"', *(f'{k}="{v}"' for k, v in sorted(labels.items()))])
            query = speed_up(_adapter_query(external[name], matchers), scale)
            target = m["external"]["target"]
            if target["type"] == "AverageValue":
                found.append(MetricSpec("external-average", name, _quantity(target["averageValue"]), query))
            else:
                found.append(MetricSpec("external-value", name, _quantity(target["value"]), query))
        else:
            raise ValueError(f"HPA {hpa['metadata']['name']}: metric type {m['type']!r} is not reproduced locally")
    return found


def _keda_metrics(scaled: Mapping[str, Any], scale: float) -> list[MetricSpec]:
    found = []
    for i, trigger in enumerate(scaled["spec"]["triggers"]):
        meta = trigger["metadata"]
        name = f"s{i}-{trigger['type']}"
        if trigger["type"] == "cpu":
            found.append(MetricSpec("cpu", "cpu", float(meta["value"])))
        elif trigger["type"] == "prometheus":
            kind = (
                "external-average" if trigger.get("metricType", "AverageValue") == "AverageValue" else "external-value"
            )
            found.append(MetricSpec(kind, name, float(meta["threshold"]), speed_up(meta["query"], scale), True))
        else:
            raise ValueError(
                f"ScaledObject {scaled['metadata']['name']}: a {trigger['type']!r} trigger needs its own server "
                "(the local job store is SQLite: the chart renders a prometheus trigger for it)"
            )
    return found


def scaling_objects(
    docs: Sequence[Mapping[str, Any]], namespace: str, time_scale: float = 1.0
) -> dict[str, ScalingObject]:
    """Per stage (app.kubernetes.io/component), its HPA or ScaledObject with the queries to run."""
    rules = _adapter_rules(docs)
    requests = {}
    for deployment in _kind(docs, "Deployment"):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        cpu = container.get("resources", {}).get("requests", {}).get("cpu", "1")
        requests[deployment["metadata"]["name"]] = _quantity(cpu)
    found = {}
    for obj in _kind(docs, "HorizontalPodAutoscaler") + _kind(docs, "ScaledObject"):
        stage = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        spec = obj["spec"]
        target = spec["scaleTargetRef"]["name"]
        if obj["kind"] == "HorizontalPodAutoscaler":
            bounds = spec.get("minReplicas", 1), spec["maxReplicas"]
            behavior = spec.get("behavior")
            metrics = _hpa_metrics(obj, rules, namespace, time_scale)
        else:
            bounds = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
            behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
            metrics = _keda_metrics(obj, time_scale)
        found[stage] = ScalingObject(
            stage=stage,
            deployment=target,
            kind=obj["kind"],
            min_replicas=int(bounds[0]),
            max_replicas=int(bounds[1]),
            behavior=Behavior.from_spec(behavior).scaled(time_scale),
            metrics=tuple(metrics),
            cpu_request=requests.get(target, 1.0),
        )
    return found
