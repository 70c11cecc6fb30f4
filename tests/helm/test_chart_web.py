"""The chart's web page (stages.web): its Deployment and Service with the `http` port, the
NetworkPolicy that opens that port to networkPolicy.webFrom, and the optional webIngress."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helm.test_chart import (
    CHART,
    KUBE_VERSIONS,
    by_kind,
    container,
    env_of,
    render,
    render_fails,
    validate_builtin,
)

CI_INGRESS = CHART / "ci" / "ingress-values.yaml"


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render(values=(CI_INGRESS,))


def test_the_web_page_has_an_http_port_in_its_pod_and_its_service_and_dials_the_gateway(
    docs: list[dict[str, Any]],
) -> None:
    deployment = by_kind(docs, "Deployment")["lip-lipline-web"]
    ports = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
    assert ports == {"grpc": 50067, "metrics": 9098, "http": 8080}
    env = env_of(deployment)
    assert env["LIPLINE_HTTP_PORT"] == "8080"
    assert env["LIPLINE_GATEWAY_ADDRESS"] == "dns:///lip-lipline-gateway.media.svc:50051"
    assert container(deployment)["readinessProbe"]["grpc"] == {"port": 50067}  # health, as every stage
    service = by_kind(docs, "Service")["lip-lipline-web"]
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"grpc": 50067, "metrics": 9098, "http": 8080}
    assert "clusterIP" not in service["spec"]
    # Only the web page has an http port.
    others = [d for name, d in by_kind(docs, "Deployment").items() if name != "lip-lipline-web"]
    assert all("http" not in {p["name"] for p in container(d)["ports"]} for d in others)


@pytest.mark.parametrize("discovery", ["dns", "kubernetes"])
def test_with_tls_on_the_gateway_the_web_page_trusts_its_ca_and_nothing_else(discovery: str) -> None:
    """The web page dials a TLS gateway by its Service's DNS name (k8s:/// discovery is plaintext only),
    trusts the CA key of the gateway's Secret (mounted alone: never the private key) and checks the
    certificate against the Service's name, or tls.serverName."""
    sets = ("tls.existingSecret=gw-tls", f"discovery.kubernetes={str(discovery == 'kubernetes').lower()}")
    for extra, name in (((), "lip-lipline-gateway"), (("tls.serverName=api.example.com",), "api.example.com")):
        web = by_kind(render(*sets, *extra), "Deployment")["lip-lipline-web"]
        env = env_of(web)
        assert env["LIPLINE_GATEWAY_ADDRESS"] == "dns:///lip-lipline-gateway.media.svc:50051"
        assert env["LIPLINE_GATEWAY_TLS_CA_FILE"] == "/etc/lipline/gateway-ca/ca.crt"
        assert env["LIPLINE_GATEWAY_TLS_SERVER_NAME"] == name
        assert "LIPLINE_TLS_KEY_FILE" not in env  # it serves no TLS itself
        volumes = {v["name"]: v for v in web["spec"]["template"]["spec"]["volumes"]}
        assert volumes["gateway-ca"]["secret"]["secretName"] == "gw-tls"
        assert volumes["gateway-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
        assert "tls" not in volumes
        mounts = {m["name"]: m for m in container(web)["volumeMounts"]}
        assert mounts["gateway-ca"] == {"name": "gateway-ca", "mountPath": "/etc/lipline/gateway-ca", "readOnly": True}
    plain = env_of(by_kind(render(), "Deployment")["lip-lipline-web"])
    assert "LIPLINE_GATEWAY_TLS_CA_FILE" not in plain and "LIPLINE_GATEWAY_TLS_SERVER_NAME" not in plain


def test_the_web_ingress_routes_every_host_to_the_http_port_with_the_controllers_annotations(
    docs: list[dict[str, Any]],
) -> None:
    ingress = by_kind(docs, "Ingress")["lip-lipline-web"]
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "3600"
    assert "nginx.ingress.kubernetes.io/backend-protocol" not in ingress["metadata"]["annotations"]  # HTTP, not gRPC
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "try.lipline.example.com"
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"] == {"name": "lip-lipline-web", "port": {"name": "http"}}
    assert ingress["spec"]["tls"] == [{"secretName": "lipline-web-tls", "hosts": ["try.lipline.example.com"]}]
    assert "lip-lipline-gateway" in by_kind(docs, "Ingress")  # the gRPC one is still there


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_the_web_objects_validate(docs: list[dict[str, Any]], kube_version: str) -> None:
    web = [d for d in docs if d["metadata"]["name"] == "lip-lipline-web"]
    assert {d["kind"] for d in web} >= {"Deployment", "Service", "Ingress", "NetworkPolicy"}
    assert validate_builtin(web, kube_version) == len(web)


def test_the_http_port_admits_web_from_and_the_gateway_admits_the_web_pods(docs: list[dict[str, Any]]) -> None:
    policies = by_kind(docs, "NetworkPolicy")
    web = policies["lip-lipline-web"]["spec"]["ingress"]
    (http,) = [r for r in web if r["ports"][0]["port"] == "http"]
    assert http["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]
    assert not [r for r in web if r["ports"][0]["port"] == "grpc"], "nobody calls the web page's gRPC port"
    gateway = policies["lip-lipline-gateway"]["spec"]["ingress"]
    (grpc_rule,) = [r for r in gateway if r["ports"][0]["port"] == "grpc"]
    callers = [
        p["podSelector"]["matchLabels"].get("app.kubernetes.io/component")
        for p in grpc_rule["from"]
        if "podSelector" in p
    ]
    assert "web" in callers


def test_without_web_from_the_page_is_open_and_without_the_option_no_web_ingress() -> None:
    docs = render()
    (http,) = [
        r
        for r in by_kind(docs, "NetworkPolicy")["lip-lipline-web"]["spec"]["ingress"]
        if r["ports"][0]["port"] == "http"
    ]
    assert "from" not in http
    assert "lip-lipline-web" not in by_kind(docs, "Ingress")


def web_env(*sets: str, values: tuple = ()) -> dict[str, str]:
    return env_of(by_kind(render(*sets, values=values), "Deployment")["lip-lipline-web"])


def test_the_pages_public_origins_come_from_its_ingress_hosts_or_its_own_config() -> None:
    """Only pages of LIPLINE_PUBLIC_ORIGINS may open the live WebSocket (services/web/origins.py): the
    chart names the webIngress hosts as browsers will show them, https:// where its tls covers them."""
    assert web_env(values=(CI_INGRESS,))["LIPLINE_PUBLIC_ORIGINS"] == "https://try.lipline.example.com"
    plain = ("webIngress.enabled=true", 'webIngress.hosts:=["a.example.com","b.example.com"]')
    tls = 'webIngress.tls:=[{"secretName":"t","hosts":["b.example.com"]}]'
    assert web_env(*plain, tls)["LIPLINE_PUBLIC_ORIGINS"] == "http://a.example.com,https://b.example.com"
    own = 'stages.web.config.public_origins:=["https://try.example.com","https://app.example.com:8443"]'
    assert web_env(own, values=(CI_INGRESS,))["LIPLINE_PUBLIC_ORIGINS"] == (
        "https://try.example.com,https://app.example.com:8443"
    )
    # Without webIngress: none, so the web server's default, the loopback origins (kubectl port-forward).
    assert web_env()["LIPLINE_PUBLIC_ORIGINS"] == ""


@pytest.mark.parametrize("hosts", ["[]", '["*.example.com"]'])
def test_a_web_ingress_for_any_host_needs_the_pages_origins_named(hosts: str) -> None:
    error = render_fails("webIngress.enabled=true", f"webIngress.hosts:={hosts}")
    assert "set stages.web.config.public_origins" in error
    web_env(
        "webIngress.enabled=true",
        f"webIngress.hosts:={hosts}",
        'stages.web.config.public_origins:=["https://x.example"]',
    )
