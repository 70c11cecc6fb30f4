"""The chart's way in: API keys (on by default, a generated Secret that `helm test` reads), the
internal token in every pod, and TLS on the gateway from an existing kubernetes.io/tls Secret with
tcpSocket probes. Every variant renders and validates strictly (helpers of test_chart.py)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from tests.helm.test_chart import (
    CHART,
    KUBE_VERSIONS,
    STAGES,
    _set_args,
    by_kind,
    container,
    env_of,
    helm,
    mounts_of,
    render,
    render_fails,
    validate_builtin,
    volumes_of,
)
from tests.helm.test_chart_values import notes

KEYS_FILE = "/etc/lipline/api-keys/keys"
TOKEN_FILE = "/etc/lipline/internal/token"
TLS = ("tls.existingSecret=gw-tls",)
OWN = (
    "auth.apiKeys.existingSecret=my-keys",
    "auth.apiKeys.secretKey=file",
    "auth.internalToken.existingSecret=my-token",
    "auth.internalToken.secretKey=t",
    "auth.webhookSecrets.existingSecret=my-hooks",
    "auth.webhookSecrets.secretKey=tenants",
)
OFF = ("auth.apiKeys.enabled=false", "auth.internalToken.enabled=false")
VARIANTS = {
    "defaults": (),
    "tls": TLS,
    "own-secrets+tls": (*OWN, *TLS, "tls.caKey=tls.crt", "tls.serverName=api.example.com"),
    "off": OFF,
}


def deployments(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name.rsplit("-", 1)[-1]: d for name, d in by_kind(docs, "Deployment").items()}


def helm_test_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (pod,) = by_kind(docs, "Pod").values()
    return pod


def helm_test_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = helm_test_pod(docs)["spec"]["containers"]
    return c


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(*VARIANTS[request.param])


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_auth_variants_validate_strictly(variant: tuple[str, list[dict[str, Any]]], kube_version: str) -> None:
    assert validate_builtin(variant[1], kube_version) > 10


@pytest.mark.parametrize("name", list(VARIANTS))
def test_auth_variants_pass_helm_lint_strict(name: str) -> None:
    result = helm("lint", "--strict", str(CHART), *_set_args(VARIANTS[name]), check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_install_generates_a_key_secret_that_the_gateway_and_the_test_pod_use() -> None:
    docs = render()
    secrets = by_kind(docs, "Secret")
    keys = secrets["lip-lipline-api-keys"]["data"]
    test_key = base64.b64decode(keys["helm-test"]).decode()
    assert len(test_key) >= 32 and test_key.isalnum()
    assert base64.b64decode(keys["keys"]).decode() == f"helm-test:{test_key}\n"
    token = base64.b64decode(secrets["lip-lipline-internal-token"]["data"]["token"]).decode()
    assert len(token) >= 32 and token != test_key

    deps = deployments(docs)
    gateway = deps["gateway"]
    assert env_of(gateway)["LIPLINE_API_KEYS_FILE"] == KEYS_FILE
    assert mounts_of(gateway)["api-keys"] == str(Path(KEYS_FILE).parent)
    assert volumes_of(gateway)["api-keys"]["secret"]["secretName"] == "lip-lipline-api-keys"
    assert all(
        m.get("readOnly") for m in container(gateway)["volumeMounts"] if m["name"] in ("api-keys", "internal-token")
    )
    for stage in STAGES:  # every pod has the token; only the gateway has the keys
        env = env_of(deps[stage])
        assert env["LIPLINE_INTERNAL_TOKEN_FILE"] == TOKEN_FILE, stage
        assert volumes_of(deps[stage])["internal-token"]["secret"]["secretName"] == "lip-lipline-internal-token"
        assert ("LIPLINE_API_KEYS_FILE" in env) == (stage == "gateway"), stage
        assert "grpc" in container(deps[stage])["readinessProbe"], stage  # no TLS: native gRPC probes

    env = {e["name"]: e for e in helm_test_container(docs)["env"]}
    ref = env["LIPLINE_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == ("lip-lipline-api-keys", "helm-test")


def test_own_secrets_are_used_and_nothing_is_generated() -> None:
    docs = render(*OWN)
    assert not {"lip-lipline-api-keys", "lip-lipline-internal-token"} & set(by_kind(docs, "Secret"))
    deps = deployments(docs)
    keys = volumes_of(deps["gateway"])["api-keys"]["secret"]
    assert keys["secretName"] == "my-keys" and keys["items"] == [{"key": "file", "path": "keys"}]
    token = volumes_of(deps["audio"])["internal-token"]["secret"]
    assert token["secretName"] == "my-token" and token["items"] == [{"key": "t", "path": "token"}]
    ref = {e["name"]: e for e in helm_test_container(docs)["env"]}["LIPLINE_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == "my-keys"


def test_webhook_secrets_are_mounted_into_the_gateway_only_and_only_when_given() -> None:
    for stage, dep in deployments(render()).items():  # the chart generates none
        assert "LIPLINE_WEBHOOK_SECRETS_FILE" not in env_of(dep) and "webhook-secrets" not in volumes_of(dep), stage
    deps = deployments(render(*OWN))
    gateway = deps["gateway"]
    assert env_of(gateway)["LIPLINE_WEBHOOK_SECRETS_FILE"] == "/etc/lipline/webhook-secrets/secrets"
    hooks = volumes_of(gateway)["webhook-secrets"]["secret"]
    assert hooks["secretName"] == "my-hooks" and hooks["items"] == [{"key": "tenants", "path": "secrets"}]
    assert all(m.get("readOnly") for m in container(gateway)["volumeMounts"] if m["name"] == "webhook-secrets")
    for stage, dep in deps.items():
        assert ("webhook-secrets" in volumes_of(dep)) == (stage == "gateway"), stage


def test_auth_off_renders_no_secret_mount_or_variable() -> None:
    docs = render(*OFF)
    assert not by_kind(docs, "Secret")
    for stage, dep in deployments(docs).items():
        env = env_of(dep)
        assert "LIPLINE_API_KEYS_FILE" not in env and "LIPLINE_INTERNAL_TOKEN_FILE" not in env, stage
        assert not {"api-keys", "internal-token"} & set(volumes_of(dep)), stage
    assert "LIPLINE_API_KEY" not in {e["name"] for e in helm_test_container(docs)["env"]}


def test_tls_mounts_the_certificate_into_the_gateway_only_and_probes_tcp() -> None:
    docs = render(*TLS)
    deps = deployments(docs)
    gateway = deps["gateway"]
    env = env_of(gateway)
    assert env["LIPLINE_TLS_CERT_FILE"] == "/etc/lipline/tls/tls.crt"
    assert env["LIPLINE_TLS_KEY_FILE"] == "/etc/lipline/tls/tls.key"
    assert volumes_of(gateway)["tls"]["secret"]["secretName"] == "gw-tls"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container(gateway)[probe]["tcpSocket"] == {"port": 50051}
        assert "grpc" not in container(gateway)[probe]
    for stage in STAGES:
        if stage != "gateway":  # stages stay plaintext, with native gRPC probes
            assert "LIPLINE_TLS_CERT_FILE" not in env_of(deps[stage]) and "tls" not in volumes_of(deps[stage])
            assert container(deps[stage])["readinessProbe"]["grpc"]["port"] > 0
    pod = helm_test_pod(docs)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["LIPLINE_TLS_CA_FILE"] == "/etc/lipline/tls/ca.crt"
    assert env["LIPLINE_TLS_SERVER_NAME"] == "lip-lipline-gateway"
    ca = {v["name"]: v for v in pod["spec"]["volumes"]}["tls-ca"]["secret"]
    assert ca["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # never the private key


def test_the_schema_refuses_unknown_auth_keys() -> None:
    assert "auth" in render_fails("auth.apiKeys.nope=1")
    assert "tls" in render_fails("tls.enabled=true")


def test_notes_tell_how_to_read_the_generated_key(tmp_path: Path) -> None:
    text = notes(tmp_path)
    assert "API KEYS are on" in text and "lip-lipline-api-keys" in text and "base64 -d" in text
    text = notes(tmp_path / "tls", *TLS, "auth.apiKeys.enabled=false")
    assert "API KEYS are off" in text and "TLS is on" in text and "tcpSocket" in text
