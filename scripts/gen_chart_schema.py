"""Write helm/lipline/values.schema.json: the chart's values, with each stage's `config` keys taken
from the service's own settings dataclass, so that a typo in a value fails `helm install`.

Run after adding a setting to a service: `python scripts/gen_chart_schema.py`. tests/helm checks
that the committed schema is what this script writes.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "helm" / "lipline" / "values.schema.json"
# Settings the chart's templates set themselves (ports, device, addresses, stores, volumes' paths).
CHART_MANAGED = {"host", "port", "port_file", "metrics_port", "device", "compile_cache_dir", "audio_address",
                 "lipsync_address", "superres_address", "job_store", "blob_store", "cache_dir"}


def settings_classes() -> dict[str, type]:
    """Each stage's settings dataclass (what `stages.<stage>.config` may set)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from services.audio.service import AudioSettings
    from services.gateway.settings import GatewaySettings
    from services.lipsync.service import LipSyncSettings
    from services.render.settings import RenderSettings
    from services.superres.service import SuperResSettings

    return {"audio": AudioSettings, "lipsync": LipSyncSettings, "superres": SuperResSettings, "render": RenderSettings,
            "gateway": GatewaySettings}


def _config_schema(cls: type) -> dict[str, Any]:
    names = sorted(f.name for f in dataclasses.fields(cls) if f.name not in CHART_MANAGED)
    return {"type": "object", "description": f"LIPLINE_* settings of {cls.__name__} (python -m services.<stage> --help)",
            "propertyNames": {"enum": names},
            "additionalProperties": {"type": ["string", "number", "boolean", "array"]}}


OBJ = {"type": "object"}
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
RESOURCES = {"type": "object", "properties": {"requests": OBJ, "limits": OBJ}, "additionalProperties": False}


def _stage_schema(cls: type, stages: list[str]) -> dict[str, Any]:
    props: dict[str, Any] = {
        "port": PORT, "metricsPort": PORT,
        "replicas": {"type": "integer", "minimum": 0},
        "gpu": {"type": "integer", "minimum": 0, "description": "GPUs per pod (gpu.resourceName); 0 = a CPU stage"},
        "headless": {"type": "boolean", "description": "a headless Service (callers balance with dns:///); false = service.type"},
        "public": {"type": "boolean", "description": "the public API: reachable by networkPolicy.gatewayFrom and helm test"},
        "stores": {"type": "boolean", "description": "uses the job and blob stores (values `store`)"},
        "dials": {"type": "array", "uniqueItems": True, "items": {"enum": stages},
                  "description": "stages this one calls: LIPLINE_<STAGE>_ADDRESS, and who their NetworkPolicy admits"},
        "cache": {"type": "object", "additionalProperties": False, "required": ["sizeLimit"],
                  "description": "a scratch emptyDir at /cache, as LIPLINE_CACHE_DIR",
                  "properties": {"sizeLimit": {"type": "string", "minLength": 1}}},
        "config": _config_schema(cls),
        "resources": RESOURCES,
        "autoscaling": {"type": "object", "additionalProperties": False,
                        "required": ["enabled", "minReplicas", "maxReplicas", "metric", "target"],
                        "properties": {"enabled": {"type": "boolean"}, "minReplicas": {"type": "integer", "minimum": 1},
                                       "maxReplicas": {"type": "integer", "minimum": 1},
                                       "metric": {"enum": ["cpu", "gpu", "queue", "segments"]},
                                       "target": {"type": "number", "exclusiveMinimum": 0},
                                       "cpu": {"type": "integer", "minimum": 1, "maximum": 1000,
                                               "description": "also scale on CPU utilisation (percent of requests)"},
                                       "behavior": OBJ}},
        "pdb": {"type": ["object", "null"], "additionalProperties": False,
                "properties": {"minAvailable": {"type": ["integer", "string"]}}},
        "startupSeconds": {"type": "integer", "minimum": 5},
        "service": {"type": "object", "additionalProperties": False, "description": "the Service when headless is false",
                    "properties": {"type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]}, "annotations": OBJ}},
    }
    return {"type": "object", "additionalProperties": False,
            "required": ["port", "metricsPort", "gpu", "headless", "public", "stores", "dials"], "properties": props}


def _store_schema() -> dict[str, Any]:
    secret_ref = {"type": "string", "description": "name of an existing Secret"}
    return {"type": "object", "additionalProperties": False, "properties": {
        "jobStore": {"type": "object", "additionalProperties": False, "properties": {
            "existingSecret": secret_ref, "secretKey": {"type": "string", "minLength": 1},
            "url": {"type": "string", "pattern": "^(postgres(ql)?://.+)?$",
                    "description": "a PostgreSQL DSN; empty = existingSecret, else the local SQLite store"}}},
        "blobStore": {"type": "object", "additionalProperties": False, "properties": {
            "url": {"type": "string", "pattern": "^(s3://[^/]+.*)?$", "description": "s3://bucket/prefix"},
            "s3": {"type": "object", "additionalProperties": False, "properties": {
                "existingSecret": secret_ref, "endpoint": {"type": "string", "pattern": "^(https?://.+)?$"},
                "region": {"type": "string"}}},
            "persistence": {"type": "object", "additionalProperties": False, "properties": {
                "existingClaim": {"type": "string"}, "mountPath": {"type": "string", "pattern": "^/"}}}}},
        "local": {"type": "object", "additionalProperties": False, "properties": {
            "enabled": {"type": "boolean"}, "existingClaim": {"type": "string"}, "size": {"type": "string", "minLength": 1},
            "storageClassName": {"type": "string"}, "mountPath": {"type": "string", "pattern": "^/"}}},
    }}


def build() -> dict[str, Any]:
    settings = settings_classes()
    from services.common.config import ServiceSettings

    claim = {"type": "object", "additionalProperties": False,
             "properties": {"existingClaim": {"type": "string"}, "mountPath": {"type": "string"}}}
    enabled = {"type": "object", "additionalProperties": False, "properties": {"enabled": {"type": "boolean"}}}
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "lipline chart values",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "image": {"type": "object", "additionalProperties": False, "properties": {
                "registry": {"type": "string", "minLength": 1}, "tag": {"type": "string"},
                "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]}}},
            "imagePullSecrets": {"type": "array"},
            "commonConfig": _config_schema(ServiceSettings),
            "gpu": {"type": "object", "additionalProperties": False, "properties": {
                "resourceName": {"type": "string", "minLength": 1}, "runtimeClassName": {"type": "string"},
                "nodeSelector": OBJ, "tolerations": {"type": "array"}}},
            "models": claim,
            "compileCache": claim,
            "stages": {"type": "object", "additionalProperties": False, "required": list(settings),
                       "properties": {name: _stage_schema(cls, list(settings)) for name, cls in settings.items()}},
            "store": _store_schema(),
            "autoscalingBehavior": OBJ,
            "keda": {"type": "object", "additionalProperties": False, "properties": {
                "enabled": {"type": "boolean"}, "prometheusAddress": {"type": "string", "pattern": "^https?://"}}},
            "podSecurityContext": OBJ, "securityContext": OBJ, "podAnnotations": OBJ, "podLabels": OBJ,
            "nodeSelector": OBJ, "tolerations": {"type": "array"}, "affinity": OBJ,
            "serviceAccount": {"type": "object", "additionalProperties": False, "properties": {
                "create": {"type": "boolean"}, "name": {"type": "string"}, "annotations": OBJ}},
            "monitoring": {"type": "object", "additionalProperties": False, "properties": {
                "serviceMonitor": {**enabled, "properties": {"enabled": {"type": "boolean"}, "interval": {"type": "string"}, "labels": OBJ}},
                "prometheusRule": {**enabled, "properties": {"enabled": {"type": "boolean"}, "labels": OBJ}},
                "dashboards": {**enabled, "properties": {"enabled": {"type": "boolean"}, "labels": OBJ}},
                "adapterRules": enabled}},
            "networkPolicy": {"type": "object", "additionalProperties": False, "properties": {
                "enabled": {"type": "boolean"}, "gatewayFrom": {"type": "array"}, "metricsFrom": {"type": "array"}}},
            "tests": {"type": "object", "additionalProperties": False, "properties": {
                "enabled": {"type": "boolean"}, "timeoutSeconds": {"type": "integer", "minimum": 10}}},
            "global": OBJ,
        },
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    SCHEMA.write_text(render())
    print(f"wrote {SCHEMA.relative_to(REPO)}")
