"""Webhooks (issue 21 item 5) through a real gateway process, on the SQLite and the PostgreSQL job
store, to a real HTTP receiver on 127.0.0.1 (http.server in a thread, allowed through
callback_http_hosts): delivered once with a valid signature, retried after 500s, a hanging receiver
cut by the timeout while another tenant's webhook goes through, a URL off the allow-list refused,
and a gateway killed mid-delivery whose restart still delivers.

Most jobs are cancelled at once (CancelJob ends a job, so it fires its webhook like a finished one):
one job renders, the others cost no rendering. Back-off and timeouts are small.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.server
import json
import secrets
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from lipline.v1 import gateway_pb2
from lipline_client import NO_RETRY
from services.gateway.client import LiplineClient
from services.local.cluster import LocalCluster
from tests.helpers.certificates import make_certificate
from tests.integration.util import SAMPLES, cut_wav, eventually, start_cluster

TIMEOUT_S = 1.0  # callback_timeout_s: the gateway's lease on a delivery is 2 x this + 1 s
DELIVERED = gateway_pb2.WebhookDelivery.DELIVERED
HOLD_S = 30.0  # the longest the receiver holds a request it was told to hold


@dataclass
class Hit:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """What the handler does per path prefix, and every request it got."""

    server: http.server.ThreadingHTTPServer
    hits: list[Hit] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)  # ends every held request

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def of(self, path: str) -> list[Hit]:
        with self.lock:
            return [h for h in self.hits if h.path == path]


class _Handler(http.server.BaseHTTPRequestHandler):
    """/ok/*: 200. /flaky/*: 500 twice, then 200. /hang/* and /hold/*: the first request is held
    (HOLD_S, or until the receiver's release), the next ones 200."""

    receiver: Receiver

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        hit = Hit(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        with self.receiver.lock:
            self.receiver.hits.append(hit)
            before = sum(1 for h in self.receiver.hits if h.path == self.path) - 1
        status = 200
        if self.path.startswith("/flaky/") and before < 2:
            status = 500
        if self.path.startswith(("/hang/", "/hold/")) and before == 0:
            self.receiver.release.wait(HOLD_S)
        with contextlib.suppress(OSError):  # the gateway gave up on this request, or died
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")


@dataclass
class World:
    cluster: LocalCluster
    receiver: Receiver
    acme: LiplineClient
    bob: LiplineClient
    carol: LiplineClient  # a tenant without a webhook secret
    secrets: dict[str, str]
    keys: dict[str, str]
    avatar: gateway_pb2.Avatar  # acme's
    bob_avatar: gateway_pb2.Avatar
    tls_base: str  # the same receiver over https, with a certificate only callback_ca_file vouches for
    secrets_file: Path


@pytest.fixture(scope="module")
def world(job_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("webhooks")
    keys = {name: secrets.token_urlsafe(24) for name in ("acme", "bob", "carol")}
    hook_secrets = {name: secrets.token_urlsafe(32) for name in ("acme", "bob")}
    (workdir / "api-keys").write_text("".join(f"{n}/ci:{k}\n" for n, k in keys.items()))
    (workdir / "webhook-secrets").write_text("".join(f"{n}:{s}\n" for n, s in hook_secrets.items()))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    receiver = Receiver(server)
    _Handler.receiver = receiver
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cert, key = make_certificate(workdir)
    tls_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    tls_server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    tls_server.socket = context.wrap_socket(tls_server.socket, server_side=True)
    threading.Thread(target=tls_server.serve_forever, daemon=True).start()
    tls_port = tls_server.server_address[1]
    gateway = [
        f"--api-keys-file={workdir / 'api-keys'}",
        f"--webhook-secrets-file={workdir / 'webhook-secrets'}",
        "--secrets-reload-s=0.2",
        f"--callback-http-hosts=127.0.0.1:{server.server_address[1]}",
        f"--callback-hosts=hooks.example.com,localhost:{tls_port}",
        f"--callback-ca-file={cert}",
        f"--callback-timeout-s={TIMEOUT_S}",
        "--callback-backoff-s=0.2",
        "--callback-backoff-max-s=0.4",
        "--callback-poll-s=0.1",
        "--segment-seconds=0.4",
    ]
    with contextlib.ExitStack() as stack:
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        stack.callback(tls_server.server_close)
        stack.callback(tls_server.shutdown)
        stack.callback(receiver.release.set)
        cluster = stack.enter_context(
            start_cluster(
                workdir / "cluster", job_store=job_store_url, extra_args={"gateway": gateway}, replicas={"render": 1}
            )
        )
        acme, bob, carol = (
            stack.enter_context(LiplineClient(cluster.gateway_address, timeout=120, api_key=keys[n]))
            for n in ("acme", "bob", "carol")
        )
        photo = (SAMPLES / "avatar.jpg").read_bytes()
        avatar, bob_avatar = acme.create_avatar(photo, name="a.jpg"), bob.create_avatar(photo, name="b.jpg")
        yield World(
            cluster,
            receiver,
            acme,
            bob,
            carol,
            hook_secrets,
            keys,
            avatar,
            bob_avatar,
            f"https://localhost:{tls_port}",
            workdir / "webhook-secrets",
        )


SPEECH = cut_wav((SAMPLES / "speech.wav").read_bytes(), 0.8)


def cancelled_job(client: LiplineClient, avatar: gateway_pb2.Avatar, url: str) -> gateway_pb2.Job:
    """A job with `url` as its callback, cancelled at once (which ends it: its webhook fires)."""
    job = client.submit_job(avatar.id, SPEECH, callback_url=url)
    client.cancel_job(job.id)
    return job


def delivered(client: LiplineClient, job_id: str, timeout: float = 30.0) -> gateway_pb2.WebhookDelivery:
    """The job's webhook once GetJob says DELIVERED."""
    return eventually(
        lambda: (hook := client.get_job(job_id).webhook).state == DELIVERED and hook,
        timeout,
        f"job {job_id}'s webhook to be delivered",
        every=0.1,
    )


def check_signature(hit: Hit, secret: str) -> None:
    """What a receiver does (the README's example): recompute the HMAC over "timestamp.body"."""
    timestamp = hit.headers["webhook-timestamp"]
    expected = "v1=" + hmac.new(secret.encode(), f"{timestamp}.".encode() + hit.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(hit.headers["webhook-signature"], expected)
    assert abs(time.time() - int(timestamp)) < 60


def test_a_finished_job_is_posted_once_signed(world: World) -> None:
    url = f"{world.receiver.base}/ok/rendered"
    job = world.acme.submit_job(world.avatar.id, SPEECH, callback_url=url)
    assert job.options.callback_url == url
    assert world.acme.get_job(job.id).webhook.state == gateway_pb2.WebhookDelivery.PENDING  # not ended yet
    assert world.acme.wait(job.id).state == gateway_pb2.JOB_STATE_SUCCEEDED
    hook = delivered(world.acme, job.id)
    assert hook.attempts == 1 and hook.last_status_code == 200 and hook.last_error == ""
    assert hook.delivered_time.seconds > 0 and hook.delivery_id
    time.sleep(0.5)  # several poll rounds: nothing more is sent
    (hit,) = world.receiver.of("/ok/rendered")
    check_signature(hit, world.secrets["acme"])
    assert hit.headers["webhook-id"] == hook.delivery_id
    assert hit.headers["content-type"] == "application/json"
    body = json.loads(hit.body)
    assert body["id"] == job.id and body["state"] == "JOB_STATE_SUCCEEDED" and body["outputSha256"]
    assert "webhook" not in body
    with pytest.raises(AssertionError):  # another tenant's secret does not verify it
        check_signature(hit, world.secrets["bob"])


def test_an_https_receiver_with_a_certificate_from_the_operators_ca_gets_it(world: World) -> None:
    """callback_ca_file: a receiver whose certificate only that CA vouches for (self-signed here; the
    system's roots would refuse it) is delivered to over https."""
    job = cancelled_job(world.acme, world.avatar, f"{world.tls_base}/ok/tls")
    hook = delivered(world.acme, job.id)
    assert hook.attempts == 1 and hook.last_status_code == 200, hook
    (hit,) = world.receiver.of("/ok/tls")
    check_signature(hit, world.secrets["acme"])


def test_a_rotated_webhook_secret_signs_the_next_delivery(world: World) -> None:
    """The secrets file re-read on change (secrets_reload_s): no restart to rotate a tenant's secret."""
    original = world.secrets_file.read_text()
    rotated = secrets.token_urlsafe(32)
    try:
        tmp = world.secrets_file.with_suffix(".tmp")
        tmp.write_text(original.replace(world.secrets["acme"], rotated))
        tmp.replace(world.secrets_file)
        eventually(
            lambda: "webhook secrets file changed: reloaded" in world.cluster.processes["gateway"].log(),
            timeout=10,
            what="the gateway to reload its webhook secrets",
        )
        job = cancelled_job(world.acme, world.avatar, f"{world.receiver.base}/ok/rotated")
        delivered(world.acme, job.id)
        (hit,) = world.receiver.of("/ok/rotated")
        check_signature(hit, rotated)
        with pytest.raises(AssertionError):
            check_signature(hit, world.secrets["acme"])
    finally:
        tmp.write_text(original)
        tmp.replace(world.secrets_file)
    eventually(
        lambda: world.cluster.processes["gateway"].log().count("webhook secrets file changed: reloaded") >= 2,
        timeout=10,
        what="the original secrets back",
    )


def test_a_receiver_that_fails_twice_gets_it_on_the_third_try(world: World) -> None:
    job = cancelled_job(world.acme, world.avatar, f"{world.receiver.base}/flaky/1")
    hook = delivered(world.acme, job.id)
    hits = world.receiver.of("/flaky/1")
    assert hook.attempts == 3 and len(hits) == 3 and hook.last_status_code == 200
    assert {h.headers["webhook-id"] for h in hits} == {hook.delivery_id}  # one delivery id to deduplicate on
    for hit in hits:
        check_signature(hit, world.secrets["acme"])
    assert json.loads(hits[-1].body)["state"] == "JOB_STATE_CANCELLED"


def test_a_hanging_receiver_is_cut_and_retried_and_another_tenant_is_not_held(world: World) -> None:
    hanging = cancelled_job(world.acme, world.avatar, f"{world.receiver.base}/hang/1")
    eventually(lambda: world.receiver.of("/hang/1"), 20, "the first post to the hanging receiver", every=0.05)
    other = cancelled_job(world.bob, world.bob_avatar, f"{world.receiver.base}/ok/bob")
    # bob's is delivered while acme's first request still hangs (held up to HOLD_S, cut at TIMEOUT_S).
    assert delivered(world.bob, other.id).attempts == 1
    check_signature(world.receiver.of("/ok/bob")[0], world.secrets["bob"])
    hook = delivered(world.acme, hanging.id)
    assert hook.attempts == 2 and len(world.receiver.of("/hang/1")) == 2
    # Each tenant sees only its own job (and so its own webhook's state).
    with pytest.raises(grpc.RpcError) as caught:
        world.bob.get_job(hanging.id)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.2:9/hook",  # a host not on callback_http_hosts
        "https://127.0.0.1:9/hook",  # https to a host listed for http only
        "http://hooks.example.com/hook",  # http to a host listed for https only
        "ftp://hooks.example.com/hook",
        "https://hooks.example.com:8443/hook",  # the listed host on another port
    ],
)
def test_a_callback_url_off_the_allow_list_is_invalid_argument(world: World, url: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        world.acme.submit_job(world.avatar.id, SPEECH, callback_url=url)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "callback_url" in (caught.value.details() or "")


def test_a_tenant_without_a_webhook_secret_is_told_so(world: World) -> None:
    carol_avatar = world.carol.create_avatar((SAMPLES / "avatar.jpg").read_bytes(), name="c.jpg")
    with pytest.raises(grpc.RpcError) as caught:
        world.carol.submit_job(carol_avatar.id, SPEECH, callback_url=f"{world.receiver.base}/ok/carol")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "webhook_secrets_file" in (caught.value.details() or "")


def test_a_gateway_killed_mid_delivery_still_delivers_after_its_restart(world: World) -> None:
    # Last in the module: it restarts the gateway.
    job = cancelled_job(world.acme, world.avatar, f"{world.receiver.base}/hold/kill")
    eventually(lambda: world.receiver.of("/hold/kill"), 20, "the post the gateway is killed in", every=0.05)
    world.cluster.kill("gateway")  # SIGKILL while the request is held
    world.receiver.release.set()
    world.cluster.restart("gateway")  # its lease expires; the restarted gateway claims it again
    with LiplineClient(world.cluster.gateway_address, timeout=60, api_key=world.keys["acme"], retry=NO_RETRY) as acme:
        hook = delivered(acme, job.id)
    hits = world.receiver.of("/hold/kill")
    assert hook.attempts == 2 and len(hits) == 2
    assert hits[0].headers["webhook-id"] == hits[1].headers["webhook-id"] == hook.delivery_id
