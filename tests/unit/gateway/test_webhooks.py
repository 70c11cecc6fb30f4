"""The gateway's webhook rules (issue 21 item 5): which callback URLs SubmitJob accepts, the
signature a receiver checks, the back-off, and the per-tenant secrets file."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest

from services.gateway.settings import GatewaySettings
from services.gateway.webhooks import CallbackRules, backoff_s, signature
from services.serving.errors import FailedPrecondition, InvalidRequest
from services.serving.settings import parse_settings
from services.serving.tenants import parse_webhook_secrets

SECRET = "s" * 32


@pytest.fixture
def rules(tmp_path: Path) -> CallbackRules:
    (tmp_path / "secrets").write_text(f"# tenants' webhook secrets\nacme:{SECRET}\n\nbob : {'b' * 30}\n")
    settings = GatewaySettings(
        callback_hosts="hooks.example.com,Other.example.com:8443",
        callback_http_hosts="receiver.internal,127.0.0.1:8080",
        webhook_secrets_file=str(tmp_path / "secrets"),
    )
    return CallbackRules(settings)


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/x",
        "https://hooks.example.com:443/x?y=1",
        "https://other.example.com:8443/x",
        "http://receiver.internal/x",
        "http://127.0.0.1:8080/x",
    ],
)
def test_listed_hosts_are_accepted(rules: CallbackRules, url: str) -> None:
    assert rules.check(url, "acme") == url


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://hooks.example.com/x", "callback_http_hosts"),  # https-only host over http
        ("https://receiver.internal/x", "callback_hosts"),  # http-only host over https
        ("https://hooks.example.com:444/x", "callback_hosts"),
        ("https://evil.example.com/x", "not on this gateway's callback_hosts"),
        ("ftp://hooks.example.com/x", "only https://"),
        ("hooks.example.com/x", "only https://"),
        ("https://hooks.example.com:99999999/x", "port is not a number"),
        ("https://hooks.example.com/" + "x" * 3000, "characters"),
    ],
)
def test_other_urls_are_invalid_argument_naming_the_setting(rules: CallbackRules, url: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        rules.check(url, "acme")


def test_a_tenant_without_a_secret_is_failed_precondition(rules: CallbackRules) -> None:
    assert rules.check("https://hooks.example.com/x", "bob")
    with pytest.raises(FailedPrecondition, match="webhook_secrets_file"):
        rules.check("https://hooks.example.com/x", "carol")


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    body = b'{"id":"j1"}'
    expected = hmac.new(SECRET.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    assert signature(SECRET, "1700000000", body) == "v1=" + expected
    assert signature(SECRET, "1700000001", body) != signature(SECRET, "1700000000", body)
    assert signature("t" * 32, "1700000000", body) != signature(SECRET, "1700000000", body)


def test_the_back_off_doubles_with_jitter_up_to_its_cap() -> None:
    for failures, full in ((1, 2.0), (2, 4.0), (3, 8.0), (10, 60.0)):
        waits = [backoff_s(failures, 2.0, 60.0) for _ in range(50)]
        assert all(full / 2 <= w <= full for w in waits)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("acme", "`tenant:secret`"),
        ("a/b:" + "s" * 30, "`tenant:secret`"),
        ("acme:short", "24..256"),
        ("acme:" + "s" * 20 + " x", "24..256"),
        (f"acme:{SECRET}\nacme:{'t' * 30}", "appears twice"),
    ],
)
def test_a_bad_secrets_file_is_refused_naming_the_line_not_the_secret(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as caught:
        parse_webhook_secrets(text, "secrets.txt")
    assert "secrets.txt, line" in str(caught.value) and SECRET not in str(caught.value)


@pytest.mark.parametrize("name", ["callback_ca_file", "audio_uri_ca_file"])
def test_a_ca_file_that_is_not_there_stops_the_start_naming_it(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_settings(GatewaySettings, [f"--{name.replace('_', '-')}={tmp_path / 'missing.pem'}"], {})
    assert f"{name} {tmp_path / 'missing.pem'} is not a readable file" in capsys.readouterr().err
