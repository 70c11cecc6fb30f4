"""The way in, secured, with real processes: API keys on the gateway's public API, the internal token
between services, and TLS on the gateway's port with a certificate the test makes (openssl).

One cluster with all three on: every public RPC without a key, or with a wrong one, ends
UNAUTHENTICATED; the right key (as x-api-key or a Bearer token) works, and a whole job completes over
TLS; a stage called without the internal token refuses; health answers without any credential; no
service logs a key or the token.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lipline.v1 import audio_pb2, gateway_pb2
from lipline_client import NO_RETRY
from services.gateway.client import LiplineClient, render_file
from services.local.cluster import REPO_ROOT, STAGES, LocalCluster
from services.web.gateway_link import GatewayLink
from tests.helpers.certificates import make_certificate
from tests.integration.util import SAMPLES, eventually, health_status, start_cluster

GATEWAY = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"]
GATEWAY_NAME = "lip-lipline-gateway"  # a name only the certificate holds, as a Service's name is in a cluster


class Secured:
    def __init__(self, cluster: LocalCluster, cert: Path, keys: dict[str, str], token: str, keys_file: Path) -> None:
        self.cluster, self.cert, self.keys, self.token, self.keys_file = cluster, cert, keys, token, keys_file

    def channel(self) -> grpc.Channel:
        return grpc.secure_channel(
            self.cluster.gateway_address, grpc.ssl_channel_credentials(root_certificates=self.cert.read_bytes())
        )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    workdir = tmp_path_factory.mktemp("auth")
    cert, key = make_certificate(workdir, extra_names=(GATEWAY_NAME,))
    keys = {"alice": secrets.token_urlsafe(24), "bob": secrets.token_urlsafe(24)}
    (workdir / "api-keys").write_text("# name:key\n" + "".join(f"{n}:{k}\n" for n, k in keys.items()))
    token = secrets.token_urlsafe(32)
    (workdir / "token").write_text(token + "\n")
    internal = [f"--internal-token-file={workdir / 'token'}"]
    extra = {stage: internal for stage in (*STAGES, "render")}
    extra["gateway"] = [
        *internal,
        f"--api-keys-file={workdir / 'api-keys'}",
        "--secrets-reload-s=0.2",
        f"--tls-cert-file={cert}",
        f"--tls-key-file={key}",
        "--segment-seconds=0.8",
    ]
    # The web page calls the TLS gateway as the chart sets it up: the CA file, the Service's name.
    extra["web"] = [f"--gateway-tls-ca-file={cert}", f"--gateway-tls-server-name={GATEWAY_NAME}"]
    with start_cluster(workdir / "cluster", extra_args=extra, replicas={"web": 1}) as cluster:
        yield Secured(cluster, cert, keys, token, workdir / "api-keys")


def _call(channel: grpc.Channel, method_name: str, metadata: tuple[tuple[str, str], ...]) -> None:
    """Call one Gateway method with an empty request (streams: one empty message) and read the answer."""
    method = GATEWAY.methods_by_name[method_name]
    path = f"/{GATEWAY.full_name}/{method.name}"
    from google.protobuf import message_factory

    request = message_factory.GetMessageClass(method.input_type)()
    response_class = message_factory.GetMessageClass(method.output_type)
    kind = {
        (False, False): channel.unary_unary,
        (False, True): channel.unary_stream,
        (True, False): channel.stream_unary,
        (True, True): channel.stream_stream,
    }[(method.client_streaming, method.server_streaming)]
    stub = kind(
        path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=response_class.FromString
    )
    answer = stub(iter([request]) if method.client_streaming else request, timeout=10, metadata=metadata)
    if method.server_streaming:
        list(answer)


@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param((), id="no-key"),
        pytest.param((("x-api-key", "not-a-key-of-this-deployment"),), id="wrong-key"),
        pytest.param((("authorization", "Bearer not-a-key-of-this-deployment"),), id="wrong-bearer"),
        pytest.param((("authorization", "Basic YWxpY2U6cGFzcw=="),), id="basic-auth"),
    ],
)
def test_every_public_rpc_without_a_valid_key_is_unauthenticated(secured: Secured, metadata: tuple) -> None:
    assert len(GATEWAY.methods) >= 9
    with secured.channel() as channel:
        for method in GATEWAY.methods:
            with pytest.raises(grpc.RpcError) as caught:
                _call(channel, method.name, metadata)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, (method.name, caught.value.details())
            assert "x-api-key" in caught.value.details()


def test_the_right_key_passes_on_every_public_rpc(secured: Secured) -> None:
    """Past authentication every RPC gets to its handler (which finds nothing for an empty request)."""
    with secured.channel() as channel:
        for method in GATEWAY.methods:
            for metadata in (
                (("x-api-key", secured.keys["alice"]),),
                (("authorization", f"Bearer {secured.keys['bob']}"),),
            ):
                try:
                    _call(channel, method.name, metadata)
                except grpc.RpcError as exc:
                    assert exc.code() != grpc.StatusCode.UNAUTHENTICATED, (method.name, exc.details())


def test_a_job_completes_over_tls_with_the_key(secured: Secured, tmp_path: Path) -> None:
    with LiplineClient(
        secured.cluster.gateway_address, timeout=120, api_key=secured.keys["alice"], tls_ca_file=str(secured.cert)
    ) as client:
        avatar, job = render_file(
            client,
            SAMPLES / "avatar.jpg",
            SAMPLES / "speech.wav",
            tmp_path / "out.mp4",
            super_resolution=True,
            write=lambda _line: None,
        )
        assert job.state == gateway_pb2.JOB_STATE_SUCCEEDED, job.error
        assert (tmp_path / "out.mp4").stat().st_size > 1000
        client.delete_avatar(avatar.id)


def test_plaintext_to_the_tls_port_fails(secured: Secured) -> None:
    with (
        LiplineClient(
            secured.cluster.gateway_address,
            timeout=5,
            api_key=secured.keys["alice"],
            tls=False,
            tls_ca_file="",
            retry=NO_RETRY,
        ) as client,
        pytest.raises(grpc.RpcError) as caught,
    ):
        client.list_avatars()
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_health_answers_without_credentials(secured: Secured) -> None:
    with secured.channel() as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    for stage in secured.cluster.stages:  # plaintext inside the cluster, no token needed for health
        assert health_status(secured.cluster.processes[stage].address) == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(
    "metadata", [(), (("x-lipline-internal", "a-wrong-token-of-enough-length"),)], ids=["no-token", "wrong-token"]
)
def test_a_stage_called_without_the_internal_token_refuses(secured: Secured, metadata: tuple) -> None:
    with grpc.insecure_channel(secured.cluster.processes["audio"].address) as channel:
        extract = channel.stream_stream(
            "/lipline.v1.AudioService/Extract",
            request_serializer=audio_pb2.ExtractRequest.SerializeToString,
            response_deserializer=audio_pb2.ExtractResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as caught:
            list(extract(iter([audio_pb2.ExtractRequest()]), timeout=10, metadata=metadata))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "internal" in caught.value.details()


def test_the_stage_accepts_the_internal_token(secured: Secured) -> None:
    with grpc.insecure_channel(secured.cluster.processes["audio"].address) as channel:
        extract = channel.stream_stream(
            "/lipline.v1.AudioService/Extract",
            request_serializer=audio_pb2.ExtractRequest.SerializeToString,
            response_deserializer=audio_pb2.ExtractResponse.FromString,
        )
        try:
            list(
                extract(
                    iter([audio_pb2.ExtractRequest()]), timeout=10, metadata=(("x-lipline-internal", secured.token),)
                )
            )
        except grpc.RpcError as exc:  # an empty request may be refused, but not for want of the token
            assert exc.code() != grpc.StatusCode.UNAUTHENTICATED, exc.details()


def test_the_helm_test_smoke_check_passes_with_the_key_and_ca_from_the_environment(secured: Secured) -> None:
    """As the chart's test pod runs it: LIPLINE_API_KEY and LIPLINE_TLS_CA_FILE, no flags."""
    command = [
        sys.executable,
        "-m",
        "services.gateway.smoke",
        f"--address={secured.cluster.gateway_address}",
        "--timeout=120",
    ]
    env = {**os.environ, "LIPLINE_TLS_CA_FILE": str(secured.cert), "LIPLINE_TLS_SERVER_NAME": "localhost"}
    refused = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr, refused.stdout + refused.stderr
    env["LIPLINE_API_KEY"] = secured.keys["bob"]
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0 and "smoke: ok" in result.stdout, result.stdout + result.stderr


def test_the_web_page_calls_the_tls_gateway_with_the_users_key(secured: Secured) -> None:
    """The web page's server reaches the TLS gateway by the CA file and the certificate's name (as the
    chart mounts and sets them), and passes the user's key: listed with alice's, refused without one."""
    url = f"{secured.cluster.web_url}/api/avatars"
    request = urllib.request.Request(url, headers={"X-Api-Key": secured.keys["alice"]})
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.status == 200
        assert isinstance(json.loads(reply.read())["avatars"], list)
    request = urllib.request.Request(url, headers={"X-Api-Key": "not-a-key-of-this-deployment"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 401


@pytest.mark.parametrize(("server_name", "reached"), [(GATEWAY_NAME, True), ("not-the-gateway", False)])
def test_the_web_pages_gateway_link_checks_the_certificate_name(
    secured: Secured, server_name: str, reached: bool
) -> None:
    async def start() -> None:
        link = GatewayLink(
            secured.cluster.gateway_address, 4 << 20, tls_ca_file=str(secured.cert), tls_server_name=server_name
        )
        try:
            await link.start(timeout_s=3.0)
        finally:
            await link.close()

    if reached:
        asyncio.run(start())
    else:
        with pytest.raises(RuntimeError, match="not SERVING"):
            asyncio.run(start())


def test_a_rotated_keys_file_takes_effect_without_a_restart_and_a_bad_one_is_refused(secured: Secured) -> None:
    """The gateway re-reads its API keys file when it changes (a Secret rotated): a new key works and a
    removed one is refused within a few seconds; a file that does not parse changes nothing."""
    original = secured.keys_file.read_text()
    carol = secrets.token_urlsafe(24)

    def status_with(key: str) -> grpc.StatusCode:
        with secured.channel() as channel:
            try:
                _call(channel, "ListAvatars", (("x-api-key", key),))
            except grpc.RpcError as exc:
                return exc.code()
        return grpc.StatusCode.OK

    try:
        assert status_with(carol) == grpc.StatusCode.UNAUTHENTICATED
        replace_file(secured.keys_file, original + f"carol:{carol}\n")
        eventually(lambda: status_with(carol) == grpc.StatusCode.OK, timeout=10, what="the new key to work")
        replace_file(secured.keys_file, original + "carol:short\n")  # a bad line: the file is refused
        eventually(
            lambda: "cannot be used; the previous one stays in force" in secured.cluster.processes["gateway"].log(),
            timeout=10,
            what="the bad file refused",
        )
        assert status_with(carol) == grpc.StatusCode.OK and status_with(secured.keys["alice"]) == grpc.StatusCode.OK
    finally:
        replace_file(secured.keys_file, original)
    eventually(lambda: status_with(carol) == grpc.StatusCode.UNAUTHENTICATED, timeout=10, what="the key removed")
    assert status_with(secured.keys["alice"]) == grpc.StatusCode.OK


def replace_file(path: Path, text: str) -> None:
    """Atomically, as an editor or kubelet would (never a half-written file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def test_no_service_logs_a_key_or_the_token(secured: Secured) -> None:
    for name, process in secured.cluster.processes.items():
        log = process.log()
        for secret in (*secured.keys.values(), secured.token):
            assert secret not in log, name
