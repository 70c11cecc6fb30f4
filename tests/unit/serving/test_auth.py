"""API keys and the internal token: parsing the files, the interceptor's decision, and the stage
channels that send the token (in-process, the EchoService of test_server)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from services.serving.auth import Auth, key_hash, parse_api_keys
from services.serving.channels import open_channel
from services.serving.metrics import Metrics
from services.serving.server import ServiceRunner
from services.serving.settings import ServiceSettings
from services.serving.tenants import IMPLICIT_TENANT, tenant_of_key
from tests.unit.serving.test_server import SERVICE, EchoService, health, run_server

ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef-xyz"
TOKEN = "internal-token-0123456789abcdef"


def test_parse_api_keys_tenants() -> None:
    keys = parse_api_keys(f"acme/ci:{ALICE}\nacme/rotated:{BOB}\nbob:{TOKEN}\n")
    assert keys == {"acme/ci": ALICE, "acme/rotated": BOB, "bob": TOKEN}
    assert [tenant_of_key(name) for name in keys] == ["acme", "acme", "bob"]  # `name:key`: its own tenant
    for bad in (f"/ci:{ALICE}", f"acme/:{ALICE}", f"a/b/c:{ALICE}", f"ac me/ci:{ALICE}"):
        with pytest.raises(ValueError, match="tenant/name"):
            parse_api_keys(bad)


def test_parse_api_keys_names_and_bare_keys() -> None:
    keys = parse_api_keys(f"# comment\n\nalice:{ALICE}\n  bob : {BOB}  \n{'z' * 20}\n")
    assert keys["alice"] == ALICE and keys["bob"] == BOB
    bare = [name for name in keys if name.startswith("key-")]
    assert bare == ["key-" + hashlib.sha256(b"z" * 20).hexdigest()[:8]]  # named by a hash, not the key
    assert keys[bare[0]] == "z" * 20


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "holds no key"),
        ("# only a comment\n", "holds no key"),
        ("alice:short", "line 1"),
        (f"alice:{ALICE}\nalice:{BOB}", "appears twice"),
        (f"alice:{ALICE}\nbob:{ALICE}", "same key appears twice"),
        (f"al ice:{ALICE}", "key name"),
        (f"alice:{ALICE} with spaces", "printable ASCII"),
        ("alice:" + "k" * 200, "printable ASCII"),
    ],
)
def test_parse_api_keys_refuses_bad_files_without_showing_keys(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as caught:
        parse_api_keys(text)
    for secret in (ALICE, BOB, "short"):
        assert secret not in str(caught.value)


def test_auth_decision() -> None:
    auth = Auth({"alice": ALICE, "bob": BOB})
    assert auth.authenticate({"x-api-key": ALICE}) == "alice"
    assert auth.authenticate({"x-api-key": BOB.encode()}) == "bob"
    assert auth.authenticate({"authorization": f"Bearer {BOB}"}) == "bob"
    assert auth.authenticate({"authorization": f"bearer {ALICE}"}) == "alice"
    for metadata in (
        {},
        {"x-api-key": "nope"},
        {"x-api-key": ALICE + "x"},
        {"authorization": ALICE},
        {"authorization": "Bearer "},
        {"x-api-key": "", "authorization": f"Bearer {ALICE}"},
    ):
        with pytest.raises(PermissionError, match="send an API key in the x-api-key metadata") as caught:
            auth.authenticate(metadata)
        assert ALICE not in str(caught.value) and BOB not in str(caught.value)
    assert key_hash("nope") in _refusal(auth, {"x-api-key": "nope"})


def test_auth_internal_token_and_off() -> None:
    assert Auth().authenticate({}) == "" and not Auth().enabled
    stage = Auth(internal_token=TOKEN)
    assert stage.authenticate({"x-lipline-internal": TOKEN}) == ""
    assert "x-lipline-internal" in _refusal(stage, {})
    assert "internal token" in _refusal(stage, {"x-lipline-internal": TOKEN[:-1]})


def test_auth_from_files(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text(f"alice:{ALICE}\n")
    (tmp_path / "token").write_text(TOKEN + "\n")
    auth = Auth.from_files(str(tmp_path / "keys"), str(tmp_path / "token"))
    assert auth.api_keys == {"alice": ALICE} and auth.internal_token == TOKEN
    with pytest.raises(ValueError, match="cannot read the API keys file"):
        Auth.from_files(str(tmp_path / "missing"))
    (tmp_path / "weak").write_text("abc\n")
    with pytest.raises(ValueError, match="internal token"):
        Auth.from_files("", str(tmp_path / "weak"))


def test_tls_settings_go_together() -> None:
    with pytest.raises(ValueError, match="tls_cert_file and tls_key_file"):
        ServiceSettings(tls_cert_file="/x.crt").validate()
    ServiceSettings(tls_cert_file="/x.crt", tls_key_file="/x.key").validate()


def test_a_bad_keys_file_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("")
    with pytest.raises(ValueError, match="holds no key"):
        ServiceRunner(EchoService(ServiceSettings(api_keys_file=str(tmp_path / "keys")), Metrics("test")))


def _refusal(auth: Auth, metadata: dict) -> str:
    with pytest.raises(PermissionError) as caught:
        auth.authenticate(metadata)
    return str(caught.value)


def test_the_server_checks_keys_and_identifies_the_client_by_key_name(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text(f"alice:{ALICE}\nbob:{BOB}\n")

    async def test(service: EchoService, runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        echo = channel.unary_unary(f"/{SERVICE}/Echo")
        assert await echo(b"hi", metadata=(("x-api-key", ALICE),)) == b"hi"
        assert await echo(b"hi", metadata=(("authorization", f"Bearer {BOB}"),)) == b"hi"
        for metadata in ((), (("x-api-key", "wrong"),)):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await echo(b"hi", metadata=metadata)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "send an API key in the x-api-key metadata" in caught.value.details()
        assert await health(channel) == health_pb2.HealthCheckResponse.SERVING  # no key needed
        stream = channel.unary_stream(f"/{SERVICE}/Stream")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            [m async for m in stream(b"2")]
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED

    service = run_server(test, api_keys_file=str(tmp_path / "keys"))
    assert service.client_ids == ["tenant:alice", "tenant:bob"]  # a name:key line is its own tenant; never the keys


def test_keys_of_one_tenant_are_one_client_and_one_tenant(tmp_path: Path) -> None:
    """Two keys of tenant acme (rotation) share its per-client caps; a key of bob is another client."""
    (tmp_path / "keys").write_text(f"acme/ci:{ALICE}\nacme/rotated:{BOB}\nbob:{TOKEN}\n")

    async def test(service: EchoService, runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        echo = channel.unary_unary(f"/{SERVICE}/Echo")
        for key in (ALICE, BOB, TOKEN):
            assert await echo(b"hi", metadata=(("x-api-key", key),)) == b"hi"

    service = run_server(test, api_keys_file=str(tmp_path / "keys"))
    assert service.client_ids == ["tenant:acme", "tenant:acme", "tenant:bob"]
    assert service.tenants == ["acme", "acme", "bob"]


def test_without_keys_every_call_is_the_implicit_tenant() -> None:
    async def test(service: EchoService, runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        echo = channel.unary_unary(f"/{SERVICE}/Echo")
        assert await echo(b"hi", metadata=(("x-api-key", "anything-at-all"),)) == b"hi"
        assert await echo(b"hi") == b"hi"

    assert run_server(test).tenants == [IMPLICIT_TENANT, IMPLICIT_TENANT]


def test_a_stage_needs_the_internal_token_and_stage_channels_send_it(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)

    async def test(service: EchoService, runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await channel.unary_unary(f"/{SERVICE}/Echo")(b"hi")
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        address = f"127.0.0.1:{runner.port}"
        for token, ok in ((TOKEN, True), ("x" * 20, False), ("", False)):
            async with open_channel(address, 4 << 20, internal_token=token) as stage:
                calls = [
                    lambda: stage.unary_unary(f"/{SERVICE}/Echo")(b"hi"),
                    lambda: _drain(stage.unary_stream(f"/{SERVICE}/Stream")(b"1")),
                    lambda: stage.stream_unary(f"/{SERVICE}/Upload")(iter([b"abc"])),
                ]
                for call in calls:
                    try:
                        await call()
                        code = grpc.StatusCode.OK
                    except grpc.aio.AioRpcError as exc:
                        code = exc.code()
                    assert (code != grpc.StatusCode.UNAUTHENTICATED) == ok, (token, code)
                assert await health(stage) == health_pb2.HealthCheckResponse.SERVING

    run_server(test, internal_token_file=str(tmp_path / "token"))


async def _drain(call: grpc.aio.UnaryStreamCall) -> None:
    async for _ in call:
        pass
