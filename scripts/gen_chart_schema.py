"""Write helm/lipline/values.schema.json: the chart's values, with each stage's `config` keys taken
from the service's own settings dataclass, so that a typo in a value fails `helm install`.

The stages and their settings classes come from the registry (services/serving/stages.py). A stage
the registry does not know (one's own image, say) still validates with the same per-stage keys; its
`config` is then any LIPLINE_* setting, since its settings class is not known here.

Run after adding a setting to a service: `python scripts/gen_chart_schema.py`. tests/helm checks
that the committed schema is what this script writes.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "helm" / "lipline" / "values.schema.json"
# Settings the chart's templates set themselves (ports, device, addresses, stores, volumes' paths).
CHART_MANAGED = {
    "host",
    "port",
    "port_file",
    "metrics_port",
    "device",
    "compile_cache_dir",
    "audio_address",
    "lipsync_address",
    "superres_address",
    "job_store",
    "blob_store",
    # values `store.outputTtlSeconds`: one retention for the gateway and the render workers
    "output_ttl_s",
    "cache_dir",
    # a stage's `advertise`: its pod IP and port
    "advertise_address",
    # values `auth` and `tls`: files mounted from Secrets
    "api_keys_file",
    "internal_token_file",
    "tls_cert_file",
    "tls_key_file",
    # the compile-cache Job (compileCache.warmJob) sets it on its own pods
    "warm_cache_only",
}


def settings_classes() -> dict[str, type]:
    """Each stage's settings dataclass (what `stages.<stage>.config` may set)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from services.serving.stages import STAGES

    classes = {}
    for stage in STAGES.values():
        module, name = stage.settings.split(":")
        classes[stage.name] = getattr(importlib.import_module(module), name)
    return classes


def _config_schema(cls: type | None) -> dict[str, Any]:
    """`config` of a stage: the fields of its settings class `cls`; any name when None (not in the registry)."""
    value = {"type": ["string", "number", "boolean", "array"]}
    if cls is None:
        return {
            "type": "object",
            "description": "LIPLINE_* settings of the stage (python -m services.<stage> --help)",
            "propertyNames": {"pattern": "^[a-z][a-z0-9_]*$", "not": {"enum": sorted(CHART_MANAGED)}},
            "additionalProperties": value,
        }
    names = sorted(f.name for f in dataclasses.fields(cls) if f.name not in CHART_MANAGED)
    return {
        "type": "object",
        "description": f"LIPLINE_* settings of {cls.__name__} (python -m services.<stage> --help)",
        "propertyNames": {"enum": names},
        "additionalProperties": value,
    }


OBJ = {"type": "object"}
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
RESOURCES = {"type": "object", "properties": {"requests": OBJ, "limits": OBJ}, "additionalProperties": False}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
INT_OR_STRING = {"type": ["integer", "string"]}
# Labels the chart sets itself: commonLabels and podLabels may not change them (selectors are immutable).
CHART_LABELS = [
    "helm.sh/chart",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "lipline.io/local-store",
]
LABELS = {**STRING_MAP, "propertyNames": {"not": {"enum": CHART_LABELS}}}


def _pod_keys() -> dict[str, Any]:
    """The pod keys a stage may set and the chart sets for every stage (the Kubernetes objects they
    pass through, checked as strictly as their shape allows: a typo in a key fails the install)."""
    env_var = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {"name": {"type": "string", "minLength": 1}, "value": {"type": "string"}, "valueFrom": OBJ},
    }
    ref = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {"name": {"type": "string", "minLength": 1}, "optional": {"type": "boolean"}},
    }
    env_from = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"prefix": {"type": "string"}, "configMapRef": ref, "secretRef": ref},
    }
    volume = {
        "type": "object",
        "required": ["name"],
        "minProperties": 2,
        "properties": {"name": {"type": "string", "minLength": 1}},
    }
    mount = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "mountPath"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "mountPath": {"type": "string", "pattern": "^/"},
            "subPath": {"type": "string"},
            "subPathExpr": {"type": "string"},
            "readOnly": {"type": "boolean"},
            "mountPropagation": {"enum": ["None", "HostToContainer", "Bidirectional"]},
            "recursiveReadOnly": {"enum": ["Disabled", "IfPossible", "Enabled"]},
        },
    }
    toleration = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "key": {"type": "string"},
            "operator": {"enum": ["Exists", "Equal"]},
            "value": {"type": "string"},
            "effect": {"enum": ["", "NoSchedule", "PreferNoSchedule", "NoExecute"]},
            "tolerationSeconds": {"type": "integer"},
        },
    }
    affinity = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"nodeAffinity": OBJ, "podAffinity": OBJ, "podAntiAffinity": OBJ},
    }
    spread = {
        "type": "object",
        "additionalProperties": False,
        "required": ["maxSkew", "topologyKey", "whenUnsatisfiable"],
        "properties": {
            "maxSkew": {"type": "integer", "minimum": 1},
            "topologyKey": {"type": "string", "minLength": 1},
            "whenUnsatisfiable": {"enum": ["DoNotSchedule", "ScheduleAnyway"]},
            "labelSelector": OBJ,
            "minDomains": {"type": "integer", "minimum": 1},
            "matchLabelKeys": {"type": "array", "items": {"type": "string"}},
            "nodeAffinityPolicy": {"enum": ["Honor", "Ignore"]},
            "nodeTaintsPolicy": {"enum": ["Honor", "Ignore"]},
        },
    }
    probe = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            name: {"type": "integer", "minimum": 1} for name in ("periodSeconds", "timeoutSeconds", "failureThreshold")
        },
    }
    probe["properties"]["initialDelaySeconds"] = {"type": "integer", "minimum": 0}
    strategy = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "type": {"enum": ["RollingUpdate", "Recreate"]},
            "rollingUpdate": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"maxSurge": INT_OR_STRING, "maxUnavailable": INT_OR_STRING},
            },
        },
    }
    return {
        "podAnnotations": {
            **STRING_MAP,
            "description": "annotations on the pods (merged: the stage's over the chart-wide)",
        },
        "podLabels": {
            **LABELS,
            "description": "labels on the pods (merged: the stage's over the chart-wide; never the selector labels)",
        },
        "extraEnv": {
            "type": "array",
            "items": env_var,
            "description": "variables added after the chart's (a container's `env` entries); a name set before is replaced",
        },
        "extraEnvFrom": {
            "type": "array",
            "items": env_from,
            "description": "ConfigMaps or Secrets as variables (a container's `envFrom`)",
        },
        "extraVolumes": {
            "type": "array",
            "items": volume,
            "description": "volumes added to the pod (pod `volumes` entries)",
        },
        "extraVolumeMounts": {
            "type": "array",
            "items": mount,
            "description": "mounts added to the container (`volumeMounts` entries)",
        },
        "nodeSelector": {
            **STRING_MAP,
            "description": "node labels the pods require; a stage's replaces the chart-wide (and gpu.*) one",
        },
        "tolerations": {
            "type": "array",
            "items": toleration,
            "description": "taints the pods tolerate; a stage's replaces the chart-wide (and gpu.*) list",
        },
        "affinity": {**affinity, "description": "the pods' affinity; a stage's replaces the chart-wide one"},
        "topologySpreadConstraints": {
            "type": "array",
            "items": spread,
            "description": "spread rules (no labelSelector = the stage's selector labels); a stage's replace the chart-wide",
        },
        "priorityClassName": {"type": "string", "description": "the pods' PriorityClass; empty = the chart-wide one"},
        "updateStrategy": {
            **strategy,
            "description": "the Deployment's strategy; empty = the chart-wide one, else RollingUpdate (maxSurge 0 for GPU stages)",
        },
        "probes": {
            "type": "object",
            "additionalProperties": False,
            "description": "gRPC probe timings, merged over the chart-wide `probes`",
            "properties": {"startup": probe, "readiness": probe, "liveness": probe},
        },
    }


def _tracing_schema() -> dict[str, Any]:
    samplers = [
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    ]
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "OpenTelemetry traces as the standard OTEL_* variables",
        "properties": {
            "enabled": {"type": "boolean", "description": "false = OTEL_SDK_DISABLED=true"},
            "endpoint": {"type": "string", "pattern": "^(https?://.+)?$", "description": "OTEL_EXPORTER_OTLP_ENDPOINT"},
            "protocol": {"enum": ["grpc", "http/protobuf"], "description": "OTEL_EXPORTER_OTLP_PROTOCOL"},
            "sampler": {"enum": samplers, "description": "OTEL_TRACES_SAMPLER"},
            "samplerArg": {
                "type": ["string", "number"],
                "description": "OTEL_TRACES_SAMPLER_ARG; empty = the SDK's default",
            },
            "resourceAttributes": {
                "type": "object",
                "description": "added to OTEL_RESOURCE_ATTRIBUTES",
                "propertyNames": {"pattern": "^[^,=\\s]+$"},
                "additionalProperties": {"type": ["string", "number", "boolean"]},
            },
        },
    }


# A stage's name: its env prefix LIPLINE_<STAGE>_ADDRESS (a hyphen becomes an underscore) and part of
# its objects' DNS names.
STAGE_NAME = "^[a-z][a-z0-9]*(-[a-z0-9]+)*$"


def _stage_schema(cls: type | None, stages: list[str]) -> dict[str, Any]:
    props: dict[str, Any] = {
        "enabled": {
            "type": "boolean",
            "description": "deploy the stage (unset = true); false leaves out its objects and its callers' address of it",
        },
        "image": {
            "enum": stages,
            "description": "run the image of this stage (lipline-<image>) instead of its own (lipsync-musetalk: lipsync)",
        },
        "module": {
            "type": "string",
            "pattern": "^[a-z][a-z0-9_]*(\\.[a-z][a-z0-9_]*)*$",
            "description": "what the container runs: python -m services.<module> (unset = the stage's name)",
        },
        "port": {**PORT, "description": "the gRPC port (LIPLINE_PORT, the Service's `grpc` port)"},
        "metricsPort": {
            **PORT,
            "description": "the /metrics port (LIPLINE_METRICS_PORT, the Service's `metrics` port)",
        },
        "httpPort": {
            **PORT,
            "description": "an HTTP port beside gRPC (the web page: LIPLINE_HTTP_PORT, the Service's `http` port, webIngress)",
        },
        "replicas": {"type": "integer", "minimum": 0, "description": "pods when autoscaling is off"},
        "gpu": {"type": "integer", "minimum": 0, "description": "GPUs per pod (gpu.resourceName); 0 = a CPU stage"},
        "headless": {
            "type": "boolean",
            "description": "a headless Service (callers balance with dns:///); false = service.type",
        },
        "public": {
            "type": "boolean",
            "description": "the public API: reachable by networkPolicy.gatewayFrom and helm test",
        },
        "stores": {"type": "boolean", "description": "uses the job and blob stores (values `store`)"},
        "outputs": {
            "type": "boolean",
            "description": "answers for or deletes job outputs: LIPLINE_OUTPUT_TTL_S from store.outputTtlSeconds",
        },
        "dials": {
            "type": "array",
            "uniqueItems": True,
            "items": {"enum": stages},
            "description": "stages this one calls: LIPLINE_<STAGE>_ADDRESS, and who their NetworkPolicy admits",
        },
        "reaches": {
            "type": "array",
            "uniqueItems": True,
            "items": {"enum": stages},
            "description": "stages this one calls at the addresses their pods advertise in the job store: only who their NetworkPolicy admits",
        },
        "advertise": {
            "type": "boolean",
            "description": "its callers find it at its pod IP, which it advertises in the job store (LIPLINE_ADVERTISE_ADDRESS=$(POD_IP):<port>)",
        },
        "cache": {
            "type": "object",
            "additionalProperties": False,
            "required": ["sizeLimit"],
            "description": "a scratch emptyDir at /cache, as LIPLINE_CACHE_DIR",
            "properties": {"sizeLimit": {"type": "string", "minLength": 1}},
        },
        "config": _config_schema(cls),
        "resources": {**RESOURCES, "description": "the container's requests and limits (GPU stages add the GPU limit)"},
        "autoscaling": {
            "type": "object",
            "additionalProperties": False,
            "description": "an HPA (or a KEDA ScaledObject) on `metric` towards `target`, within min/maxReplicas",
            "required": ["enabled", "minReplicas", "maxReplicas", "metric", "target"],
            "properties": {
                "enabled": {"type": "boolean"},
                "minReplicas": {"type": "integer", "minimum": 1},
                "maxReplicas": {"type": "integer", "minimum": 1},
                "metric": {"enum": ["cpu", "gpu", "queue", "segments", "sessions"]},
                "target": {"type": "number", "exclusiveMinimum": 0},
                "cpu": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 1000,
                    "description": "also scale on CPU utilisation (percent of requests)",
                },
                "behavior": OBJ,
            },
        },
        "pdb": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "description": "a PodDisruptionBudget, where at least two replicas run; null = none",
            "properties": {"minAvailable": {"type": ["integer", "string"]}},
        },
        "startupSeconds": {
            "type": "integer",
            "minimum": 5,
            "description": "how long the startup probe waits for SERVING (a cold torch.compile on GPU stages)",
        },
        "service": {
            "type": "object",
            "additionalProperties": False,
            "description": "the Service when headless is false",
            "properties": {"type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]}, "annotations": OBJ},
        },
        "runtimeClassName": {"type": "string", "description": "GPU stages: replaces gpu.runtimeClassName"},
        "gpuResourceName": {
            "type": "string",
            "description": "GPU stages: replaces gpu.resourceName (a pool with MIG or shared GPUs)",
        },
        **_pod_keys(),
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["port", "metricsPort", "gpu", "headless", "public", "stores", "dials"],
        "properties": props,
    }


def _store_schema() -> dict[str, Any]:
    secret_ref = {"type": "string", "description": "name of an existing Secret"}
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "jobStore": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "existingSecret": secret_ref,
                    "secretKey": {"type": "string", "minLength": 1},
                    "url": {
                        "type": "string",
                        "pattern": "^(postgres(ql)?://.+)?$",
                        "description": "a PostgreSQL DSN; empty = existingSecret, else the local SQLite store",
                    },
                },
            },
            "blobStore": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "url": {"type": "string", "pattern": "^(s3://[^/]+.*)?$", "description": "s3://bucket/prefix"},
                    "s3": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "existingSecret": secret_ref,
                            "endpoint": {"type": "string", "pattern": "^(https?://.+)?$"},
                            "region": {"type": "string"},
                        },
                    },
                    "persistence": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "existingClaim": {"type": "string"},
                            "mountPath": {"type": "string", "pattern": "^/"},
                        },
                    },
                },
            },
            "outputTtlSeconds": {
                "type": "number",
                "minimum": 0,
                "description": "seconds an output is kept after its job succeeds (0 = forever): "
                "LIPLINE_OUTPUT_TTL_S of the gateway and the render workers",
            },
            "local": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {"type": "boolean"},
                    "existingClaim": {"type": "string"},
                    "size": {"type": "string", "minLength": 1},
                    "storageClassName": {"type": "string"},
                    "mountPath": {"type": "string", "pattern": "^/"},
                },
            },
        },
    }


def _auth_schema() -> dict[str, Any]:
    key = {"type": "string", "minLength": 1, "pattern": "^[-._a-zA-Z0-9]+$"}  # a Secret data key
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "apiKeys": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {"type": "boolean", "description": "the gateway requires an API key on every RPC"},
                    "existingSecret": {
                        "type": "string",
                        "description": "Secret with the keys file; empty = a generated one",
                    },
                    "secretKey": key,
                    "testSecretKey": key,
                },
            },
            "internalToken": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {"type": "boolean", "description": "the stages require the internal token"},
                    "existingSecret": {
                        "type": "string",
                        "description": "Secret with the token; empty = a generated one",
                    },
                    "secretKey": key,
                },
            },
            "webhookSecrets": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "existingSecret": {
                        "type": "string",
                        "description": "Secret with the tenants' webhook secrets (`tenant:secret` lines); empty = no webhooks",
                    },
                    "secretKey": key,
                },
            },
        },
    }


# -- the optional way in (ingress, grpcRoute) and the Jobs' claims (models.download, compileCache.warmJob)
_BOOL = {"type": "boolean"}
# A DNS name as Ingress and Gateway API take it, "*." wildcard first label allowed.
_HOSTNAME = {"type": "string", "pattern": "^(\\*\\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"}


def _claim(description: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "description": description,
        "properties": {
            "existingClaim": {"type": "string", "description": "an existing PersistentVolumeClaim; empty = none"},
            "mountPath": {"type": "string", "pattern": "^/"},
            **extra,
        },
    }


def _models_schema() -> dict[str, Any]:
    """`models`: the weights' claim, and the Job that fills it (`download`)."""
    segment = "[A-Za-z0-9_][A-Za-z0-9._-]*"
    item = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "url", "sha256"],
        "properties": {
            "name": {
                "type": "string",
                "pattern": f"^{segment}(/{segment})*$",
                "description": "the file under models.mountPath (a stage's config.checkpoint)",
            },
            "url": {
                "type": "string",
                "pattern": "^(https?://[^/]+.*|s3://[^/]+/.+)$",
                "description": "http(s):// or s3://bucket/key",
            },
            "sha256": {"type": "string", "pattern": "^[0-9a-fA-F]{64}$", "description": "the file's sha256, hex"},
        },
    }
    download = {
        "type": "object",
        "additionalProperties": False,
        "description": "a pre-install/pre-upgrade hook Job that downloads `items` onto the claim",
        "properties": {
            "enabled": _BOOL,
            "items": {"type": "array", "items": item},
            "image": {"type": "string", "description": "the Job's image; empty = the gateway image"},
            "s3": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "existingSecret": {
                        "type": "string",
                        "description": "Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                    },
                    "endpoint": {"type": "string", "pattern": "^(https?://.+)?$"},
                    "region": {"type": "string"},
                },
            },
            "serviceAccountName": {"type": "string"},
            "backoffLimit": {"type": "integer", "minimum": 0},
            "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
            "resources": RESOURCES,
        },
    }
    return _claim("the model weights' volume", {"download": download})


def _compile_cache_schema() -> dict[str, Any]:
    """`compileCache`: the torch.compile artifacts' claim, and the Jobs that fill it (`warmJob`)."""
    warm = {
        "type": "object",
        "additionalProperties": False,
        "description": "one Job per GPU stage and release revision that compiles and saves the cache, then exits",
        "properties": {
            "enabled": _BOOL,
            "backoffLimit": {"type": "integer", "minimum": 0},
            "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
        },
    }
    return _claim("torch.compile artifacts shared by the GPU pods", {"warmJob": warm})


def _ingress_schema() -> dict[str, Any]:
    tls = {
        "type": "object",
        "additionalProperties": False,
        "required": ["secretName"],
        "properties": {
            "secretName": {"type": "string", "minLength": 1},
            "hosts": {"type": "array", "items": _HOSTNAME},
        },
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "an Ingress to the public stage's Service (gRPC)",
        "properties": {
            "enabled": _BOOL,
            "className": {"type": "string", "description": "spec.ingressClassName; empty = the cluster's default"},
            "annotations": {**STRING_MAP, "description": "merged over the chart's backend-protocol annotation"},
            "hosts": {"type": "array", "items": _HOSTNAME, "description": "host names; empty = any host"},
            "tls": {"type": "array", "items": tls, "description": "spec.tls: existing kubernetes.io/tls Secrets"},
        },
    }


def _web_ingress_schema() -> dict[str, Any]:
    schema = _ingress_schema()
    schema["description"] = "an Ingress to the web page's Service (HTTP and its live WebSocket)"
    schema["properties"]["annotations"] = {
        **STRING_MAP,
        "description": "the ingress controller's annotations (WebSocket timeouts, body size)",
    }
    return schema


def _grpc_route_schema() -> dict[str, Any]:
    parent = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {
            "group": {"type": "string"},
            "kind": {"type": "string"},
            "namespace": {"type": "string"},
            "name": {"type": "string", "minLength": 1},
            "sectionName": {"type": "string"},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
        },
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "a Gateway API GRPCRoute (gateway.networking.k8s.io/v1) to the public stage's Service",
        "properties": {
            "enabled": _BOOL,
            "annotations": STRING_MAP,
            "parentRefs": {"type": "array", "items": parent, "description": "the Gateway(s) and listeners"},
            "hostnames": {"type": "array", "items": _HOSTNAME},
        },
    }


def build() -> dict[str, Any]:
    settings = settings_classes()
    from services.serving.settings import ServiceSettings

    enabled = {"type": "object", "additionalProperties": False, "properties": {"enabled": {"type": "boolean"}}}
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "lipline chart values",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "image": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "registry": {"type": "string", "minLength": 1},
                    "tag": {"type": "string"},
                    "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
                },
            },
            "imagePullSecrets": {"type": "array"},
            "commonConfig": _config_schema(ServiceSettings),
            "gpu": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "resourceName": {
                        "type": "string",
                        "minLength": 1,
                        "description": "the GPU resource GPU stages request (a stage's gpuResourceName replaces it)",
                    },
                    "runtimeClassName": {
                        "type": "string",
                        "description": "GPU stages' RuntimeClass; empty = the node's default",
                    },
                    "nodeSelector": {
                        **STRING_MAP,
                        "description": "added to nodeSelector for GPU stages without their own",
                    },
                    "tolerations": {
                        **_pod_keys()["tolerations"],
                        "description": "added to tolerations for GPU stages without their own",
                    },
                },
            },
            "models": _models_schema(),
            "compileCache": _compile_cache_schema(),
            "stages": {
                "type": "object",
                "required": list(settings),
                "propertyNames": {"pattern": STAGE_NAME},
                "properties": {name: _stage_schema(cls, list(settings)) for name, cls in settings.items()},
                "additionalProperties": _stage_schema(None, list(settings)),
            },
            "store": _store_schema(),
            "autoscalingBehavior": OBJ,
            "keda": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {"type": "boolean"},
                    "prometheusAddress": {"type": "string", "pattern": "^https?://"},
                },
            },
            "podSecurityContext": OBJ,
            "securityContext": OBJ,
            **_pod_keys(),
            "terminationGraceMarginSeconds": {
                "type": "integer",
                "minimum": 0,
                "description": "added to a stage's grace_s for its terminationGracePeriodSeconds",
            },
            "nameOverride": {"type": "string", "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$"},
            "fullnameOverride": {"type": "string", "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$"},
            "commonLabels": {**LABELS, "description": "labels on every object and pod (never selectors)"},
            "tracing": _tracing_schema(),
            "discovery": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "kubernetes": {
                        "type": "boolean",
                        "description": "callers watch EndpointSlices (a Role to list/watch them)",
                    }
                },
            },
            "serviceAccount": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"create": {"type": "boolean"}, "name": {"type": "string"}, "annotations": OBJ},
            },
            "monitoring": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "labels": {
                        **LABELS,
                        "description": "on the ServiceMonitor and PrometheusRule (kube-prometheus-stack: release)",
                    },
                    "serviceMonitor": {
                        **enabled,
                        "properties": {
                            "enabled": {
                                "type": "boolean",
                                "description": "renders only where monitoring.coreos.com/v1 is served",
                            },
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "labels": LABELS,
                        },
                    },
                    "prometheusRule": {
                        **enabled,
                        "properties": {
                            "enabled": {
                                "type": "boolean",
                                "description": "renders only where monitoring.coreos.com/v1 is served",
                            },
                            "labels": LABELS,
                            "runbookBaseUrl": {
                                "type": "string",
                                "pattern": "^https?://[^#]+$",
                                "description": "alerts' runbook_url is <runbookBaseUrl>#<alert in lower case>",
                            },
                        },
                    },
                    "dashboards": {**enabled, "properties": {"enabled": {"type": "boolean"}, "labels": OBJ}},
                    "adapterRules": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "configMap": {
                                "type": "boolean",
                                "description": "also render the prometheus-adapter rules as a ConfigMap",
                            }
                        },
                    },
                },
            },
            "networkPolicy": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {"type": "boolean"},
                    "gatewayFrom": {"type": "array"},
                    "webFrom": {"type": "array"},
                    "metricsFrom": {"type": "array"},
                },
            },
            "auth": _auth_schema(),
            "tls": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "existingSecret": {
                        "type": "string",
                        "description": "kubernetes.io/tls Secret of the gateway's port; empty = plaintext",
                    },
                    "caKey": {
                        "type": "string",
                        "minLength": 1,
                        "description": "the key of the Secret the web page and helm test trust as the gateway's CA",
                    },
                    "serverName": {
                        "type": "string",
                        "description": "the name the web page and helm test check the gateway's certificate against",
                    },
                },
            },
            "ingress": _ingress_schema(),
            "webIngress": _web_ingress_schema(),
            "grpcRoute": _grpc_route_schema(),
            "tests": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"enabled": {"type": "boolean"}, "timeoutSeconds": {"type": "integer", "minimum": 10}},
            },
            "global": OBJ,
        },
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    SCHEMA.write_text(render())
    print(f"wrote {SCHEMA.relative_to(REPO)}")
