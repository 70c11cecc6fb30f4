"""The web server's settings and its table of gateway statuses."""

from __future__ import annotations

import grpc
import pytest

from services.serving.settings import parse_settings
from services.web.gateway_link import http_status, key_metadata
from services.web.settings import WebSettings


def test_the_defaults_are_the_registrys_and_the_gateways_limits() -> None:
    s = parse_settings(WebSettings, [], {})
    assert (s.port, s.metrics_port, s.http_port) == (50067, 9098, 8080)
    assert s.gateway_address == "127.0.0.1:50051"
    assert (s.max_avatar_bytes, s.max_audio_bytes) == (200 * 1024 * 1024, 50 * 1024 * 1024)
    assert s.require_api_key
    assert s.public_origins == ()  # the loopback origins of the HTTP port (services/web/origins.py)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--http-port=70000"], "http_port 70000"),
        (["--allowed-origins=https://a.example/"], "allowed_origins"),
        (
            ["--public-origins=try.example.com"],
            "public_origins: 'try.example.com' is not an http:// or https:// origin",
        ),
        (["--max-live-message-bytes=10"], "max_live_message_bytes"),
        (
            ["--gateway-tls-ca-file=/ca.crt", "--gateway-address=k8s:///gw.ns:50051"],
            "over TLS the gateway is one channel",
        ),
        (["--gateway-tls=true", "--gateway-address=file:///run/gw.txt"], "k8s:///, file:// and lists"),
    ],
)
def test_bad_settings_say_which(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(WebSettings, argv, {})
    assert says in capsys.readouterr().err


def test_gateway_statuses_become_http_statuses_a_page_can_act_on() -> None:
    assert http_status(grpc.StatusCode.UNAUTHENTICATED) == 401
    assert http_status(grpc.StatusCode.NOT_FOUND) == 404
    assert http_status(grpc.StatusCode.INVALID_ARGUMENT) == 400
    assert http_status(grpc.StatusCode.RESOURCE_EXHAUSTED) == 429
    assert http_status(grpc.StatusCode.UNAVAILABLE) == 503
    assert http_status(grpc.StatusCode.DATA_LOSS) == 502


def test_the_key_goes_as_x_api_key_metadata_and_nothing_when_there_is_none() -> None:
    assert key_metadata("k") == (("x-api-key", "k"),)
    assert key_metadata("") == ()
