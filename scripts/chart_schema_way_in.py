"""Schema fragments of the chart's optional way in and Jobs, for scripts/gen_chart_schema.py:
`ingress`, `grpcRoute`, `models` (with `models.download`) and `compileCache` (with `warmJob`).

Kept apart so that the generator only plugs them in (`"models": models_schema()`, ...). Every object
is closed (additionalProperties false), like the rest of the schema. Patterns use no look-ahead:
helm checks them with Go's regexp. Standard library only.
"""

from __future__ import annotations

from typing import Any

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_BOOL = {"type": "boolean"}
# A DNS name as Ingress and Gateway API take it, "*." wildcard first label allowed.
_HOSTNAME = {"type": "string", "pattern": "^(\\*\\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"}
_RESOURCES = {"type": "object", "additionalProperties": False,
              "properties": {"requests": {"type": "object"}, "limits": {"type": "object"}}}


def _claim(description: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "description": description, "properties": {
        "existingClaim": {"type": "string", "description": "an existing PersistentVolumeClaim; empty = none"},
        "mountPath": {"type": "string", "pattern": "^/"}, **extra}}


def models_schema() -> dict[str, Any]:
    """`models`: the weights' claim, and the Job that fills it (`download`)."""
    segment = "[A-Za-z0-9_][A-Za-z0-9._-]*"
    item = {"type": "object", "additionalProperties": False, "required": ["name", "url", "sha256"], "properties": {
        "name": {"type": "string", "pattern": f"^{segment}(/{segment})*$",
                 "description": "the file under models.mountPath (a stage's config.checkpoint)"},
        "url": {"type": "string", "pattern": "^(https?://[^/]+.*|s3://[^/]+/.+)$",
                "description": "http(s):// or s3://bucket/key"},
        "sha256": {"type": "string", "pattern": "^[0-9a-fA-F]{64}$", "description": "the file's sha256, hex"}}}
    download = {"type": "object", "additionalProperties": False,
                "description": "a pre-install/pre-upgrade hook Job that downloads `items` onto the claim", "properties": {
                    "enabled": _BOOL,
                    "items": {"type": "array", "items": item},
                    "image": {"type": "string", "description": "the Job's image; empty = the gateway image"},
                    "s3": {"type": "object", "additionalProperties": False, "properties": {
                        "existingSecret": {"type": "string", "description": "Secret with AWS_ACCESS_KEY_ID and "
                                                                            "AWS_SECRET_ACCESS_KEY"},
                        "endpoint": {"type": "string", "pattern": "^(https?://.+)?$"},
                        "region": {"type": "string"}}},
                    "serviceAccountName": {"type": "string"},
                    "backoffLimit": {"type": "integer", "minimum": 0},
                    "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
                    "resources": _RESOURCES}}
    return _claim("the model weights' volume", {"download": download})


def compile_cache_schema() -> dict[str, Any]:
    """`compileCache`: the torch.compile artifacts' claim, and the Jobs that fill it (`warmJob`)."""
    warm = {"type": "object", "additionalProperties": False,
            "description": "one Job per GPU stage and release revision that compiles and saves the cache, then exits",
            "properties": {"enabled": _BOOL, "backoffLimit": {"type": "integer", "minimum": 0},
                           "activeDeadlineSeconds": {"type": "integer", "minimum": 1}}}
    return _claim("torch.compile artifacts shared by the GPU pods", {"warmJob": warm})


def ingress_schema() -> dict[str, Any]:
    tls = {"type": "object", "additionalProperties": False, "required": ["secretName"], "properties": {
        "secretName": {"type": "string", "minLength": 1}, "hosts": {"type": "array", "items": _HOSTNAME}}}
    return {"type": "object", "additionalProperties": False, "description": "an Ingress to the public stage's Service (gRPC)",
            "properties": {
                "enabled": _BOOL,
                "className": {"type": "string", "description": "spec.ingressClassName; empty = the cluster's default"},
                "annotations": {**_STRING_MAP, "description": "merged over the chart's backend-protocol annotation"},
                "hosts": {"type": "array", "items": _HOSTNAME, "description": "host names; empty = any host"},
                "tls": {"type": "array", "items": tls, "description": "spec.tls: existing kubernetes.io/tls Secrets"}}}


def grpc_route_schema() -> dict[str, Any]:
    parent = {"type": "object", "additionalProperties": False, "required": ["name"], "properties": {
        "group": {"type": "string"}, "kind": {"type": "string"}, "namespace": {"type": "string"},
        "name": {"type": "string", "minLength": 1}, "sectionName": {"type": "string"},
        "port": {"type": "integer", "minimum": 1, "maximum": 65535}}}
    return {"type": "object", "additionalProperties": False,
            "description": "a Gateway API GRPCRoute (gateway.networking.k8s.io/v1) to the public stage's Service",
            "properties": {
                "enabled": _BOOL,
                "annotations": _STRING_MAP,
                "parentRefs": {"type": "array", "items": parent, "description": "the Gateway(s) and listeners"},
                "hostnames": {"type": "array", "items": _HOSTNAME}}}
