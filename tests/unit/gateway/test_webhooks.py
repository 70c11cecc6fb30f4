"""The gateway's webhook rules (issue 21 item 5): which callback URLs SubmitJob accepts, the
signature a receiver checks, the back-off, and the per-tenant secrets file."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import typing
from pathlib import Path

import pytest
import yarl

from services.gateway.settings import GatewaySettings
from services.gateway.urls import CheckedUrl
from services.gateway.webhooks import CallbackRules, WebhookSender, backoff_s, signature
from services.jobs.store.jobs import DeliveryState, NewJob
from services.serving.errors import FailedPrecondition, InvalidRequest
from services.serving.metrics import Metrics
from services.serving.settings import parse_settings
from services.serving.tenants import parse_webhook_secrets
from tests.helpers.stores import Stores, temp_stores

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
def test_listed_hosts_are_accepted_as_the_parsed_url_that_is_sent(rules: CallbackRules, url: str) -> None:
    checked = rules.check(url, "acme")
    assert isinstance(checked, CheckedUrl) and checked.url == yarl.URL(url, encoded=True)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://hooks.example.com/x", "callback_http_hosts"),  # https-only host over http
        ("https://receiver.internal/x", "callback_hosts"),  # http-only host over https
        ("https://hooks.example.com:444/x", "callback_hosts"),
        ("https://evil.example.com/x", "not on this gateway's callback_hosts"),
        ("ftp://hooks.example.com/x", "only https://"),
        ("hooks.example.com/x", "only https://"),
        ("https://hooks.example.com:99999999/x", "is not a number in 1..65535"),
        ("https://hooks.example.com/" + "x" * 3000, "characters"),
        # issue 29 item 3: what two parsers read differently (urllib saw host 127.0.0.1:8080, listed)
        ("http://127.0.0.1:6\\@127.0.0.1:8080/hook", "a backslash is not allowed"),
        ("http://127.0.0.1:8080/ho%5Cok", "encodes a backslash"),
        ("http://127.0.0.1:8080/hook\t", "tabs and line breaks"),
        ("http://127.0.0.1:8080/hook\r\nX-Evil: 1", "tabs and line breaks"),
        ("http://user:pw@127.0.0.1:8080/hook", "user name or password"),
        ("http://[fe80::1%25eth0]:8080/hook", "IPv6 zone id"),
        ("https://hooks\uff0eexample.com/x", "U+FF0E"),
        ("https://hooks\u3002example.com/x", "U+3002"),
        ("https://hooks\uff61example.com/x", "U+FF61"),
        ("https://hooks.example.com./x", "ends with '.'"),
    ],
)
def test_other_urls_are_invalid_argument_naming_the_setting(rules: CallbackRules, url: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(says)):
        rules.check(url, "acme")


def test_the_sender_posts_the_checked_url_not_a_string() -> None:
    assert typing.get_type_hints(WebhookSender._post)["target"] is CheckedUrl
    assert typing.get_type_hints(CallbackRules.check)["return"] is CheckedUrl


def test_what_is_posted_is_what_was_checked_byte_for_byte(tmp_path: Path) -> None:
    """The sender's own loop on a SQLite job store, to a receiver on 127.0.0.1 that reads the request
    line: the stored callback_url is parsed by the same rules and posted as written (no re-quoting,
    no dot segments removed); one whose host the operator has since unlisted is not posted at all."""
    path = "/a/../hook%2Fx;v=1?sig=a%2Fb%3D"

    async def run(stores: Stores) -> list[bytes]:
        seen: list[bytes] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(await reader.readline())
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        for job_id, host in (("listed", f"127.0.0.1:{port}"), ("unlisted", f"localhost:{port}")):
            stores.jobs.create_job(
                NewJob(
                    job_id,
                    "a" * 24,
                    "tenant:acme",
                    b"",
                    0.8,
                    25.0,
                    20,
                    [(0, 20)],
                    tenant="acme",
                    callback_url=f"http://{host}{path}",
                )
            )
            stores.jobs.cancel_job(job_id)  # ended: its webhook is due
        settings = GatewaySettings(callback_http_hosts=f"127.0.0.1:{port}", callback_poll_s=0.05)
        rules = CallbackRules(settings)
        rules.use_secrets({"acme": SECRET})
        sender = WebhookSender(stores.jobs, rules, settings, Metrics("gateway"))
        async with server:
            sender.start()
            try:
                async with asyncio.timeout(60):
                    while any(stores.jobs.get_delivery(j).attempts == 0 for j in ("listed", "unlisted")):  # type: ignore[union-attr]
                        await asyncio.sleep(0.05)
            finally:
                await sender.close()
        return seen

    with temp_stores(tmp_path) as stores:
        seen = asyncio.run(run(stores))
        listed, unlisted = stores.jobs.get_delivery("listed"), stores.jobs.get_delivery("unlisted")
    assert listed is not None and listed.state is DeliveryState.DELIVERED, listed
    assert unlisted is not None and "not allowed any more" in unlisted.last_error, unlisted
    assert "callback_http_hosts" in unlisted.last_error
    assert seen == [f"POST {path} HTTP/1.1\r\n".encode()]


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
