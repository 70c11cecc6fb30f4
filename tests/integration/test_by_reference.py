"""Inputs and outputs by reference, against real services on a blob store on S3 (moto's server):
SubmitJob's audio_uri from the bucket and from an allow-listed https host (a local TLS server with a
self-signed certificate the gateway is told to trust), every refusal with its status, and GetOutputUrl's
presigned URL downloaded with plain urllib (and refused on a folder store, and to another tenant)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import http.server
import secrets
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from lipline.v1 import gateway_pb2
from lipline_client import NO_RETRY
from services.gateway.client import LiplineClient
from services.jobs.store.s3 import S3BlobStore
from services.local.cluster import LocalCluster
from tests.helpers.certificates import make_certificate
from tests.helpers.s3rver import S3rver
from tests.helpers.s3server import S3Server
from tests.integration.util import SAMPLES, cut_wav, start_cluster

MAX_AUDIO_BYTES = 400_000  # small, so "too large" needs no big file (the 1.5 s clip is ~66 KB)
URL_TTL_S = 4.0
FETCH_TIMEOUT_S = 2.0
SUCCEEDED = gateway_pb2.JOB_STATE_SUCCEEDED


class AudioHost(http.server.ThreadingHTTPServer):
    """An https server on 127.0.0.1 with the routes the tests fetch."""

    daemon_threads = True

    def __init__(self, speech: bytes, cert: Path, key: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.speech = speech
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.stop = threading.Event()

    @property
    def base(self) -> str:
        return f"https://localhost:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: AudioHost

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        port = self.server.server_address[1]
        routes: dict[str, Callable[[], None]] = {
            "/speech.wav": lambda: self._send(200, self.server.speech),
            "/moved": lambda: self._redirect("/speech.wav"),
            "/away": lambda: self._redirect(f"https://127.0.0.1:{port}/speech.wav"),
            "/plain": lambda: self._redirect(f"http://localhost:{port}/speech.wav"),
            "/big": lambda: self._send(200, b"\0" * (MAX_AUDIO_BYTES + 1)),
            "/big-chunked": self._chunked_big,
            "/slow": self._slow,
            "/noise": lambda: self._send(200, b"this is not audio" * 100),
            "/broken": lambda: self._send(503, b"down"),
        }
        routes.get(self.path, lambda: self._send(404, b"no such file"))()

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _chunked_big(self) -> None:
        """No Content-Length: the limit must hold while reading."""
        self.protocol_version = "HTTP/1.0"
        self.send_response(200)
        self.end_headers()
        with contextlib.suppress(OSError):
            for _ in range(MAX_AUDIO_BYTES // 65536 + 2):
                self.wfile.write(b"\0" * 65536)

    def _slow(self) -> None:
        """Headers at once, then a byte now and then: only an overall time limit stops it."""
        body = self.server.speech
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):
            for i in range(len(body)):
                if self.server.stop.wait(0.2):
                    return
                self.wfile.write(body[i : i + 1])
                self.wfile.flush()


@dataclasses.dataclass
class World:
    cluster: LocalCluster
    s3: S3Server
    bucket: S3BlobStore  # the blob store's bucket, no prefix: where a backend keeps its media
    host: AudioHost
    acme: LiplineClient
    bob: LiplineClient
    speech: bytes


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("by-reference")
    cert, key = make_certificate(workdir)
    speech = cut_wav((SAMPLES / "speech.wav").read_bytes(), 1.5)
    keys = {"acme": secrets.token_urlsafe(16), "bob": secrets.token_urlsafe(16)}
    (workdir / "api-keys").write_text("".join(f"{n}:{k}\n" for n, k in keys.items()))
    with contextlib.ExitStack() as stack:
        s3 = stack.enter_context(S3Server())
        host = AudioHost(speech, cert, key)
        threading.Thread(target=host.serve_forever, daemon=True).start()
        stack.callback(host.server_close)
        stack.callback(host.shutdown)
        stack.callback(host.stop.set)
        gateway = [
            f"--api-keys-file={workdir / 'api-keys'}",
            f"--audio-uri-hosts=localhost:{host.server_address[1]},unused.example.com",
            f"--audio-uri-ca-file={cert}",
            f"--audio-uri-timeout-s={FETCH_TIMEOUT_S}",
            f"--max-audio-bytes={MAX_AUDIO_BYTES}",
            f"--output-url-ttl-s={URL_TTL_S}",
        ]
        cluster = stack.enter_context(
            start_cluster(
                workdir / "cluster", blob_store=f"{s3.url}/lipline", env=s3.env, extra_args={"gateway": gateway}
            )
        )
        bucket = S3BlobStore(s3.url, s3.env)
        stack.callback(bucket.close)
        acme, bob = (
            stack.enter_context(LiplineClient(cluster.gateway_address, timeout=120, api_key=keys[n], retry=NO_RETRY))
            for n in ("acme", "bob")
        )
        yield World(cluster, s3, bucket, host, acme, bob, speech)


@pytest.fixture(scope="module")
def avatar(world: World) -> gateway_pb2.Avatar:
    return world.acme.create_avatar((SAMPLES / "avatar.jpg").read_bytes(), name="avatar.jpg")


def refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_audio_from_the_bucket_renders_and_its_output_url_downloads_with_plain_http(
    world: World, avatar: gateway_pb2.Avatar, tmp_path: Path
) -> None:
    world.bucket.put("media/customer-1/speech.wav", world.speech)
    job = world.acme.submit_job(avatar.id, audio_uri=f"{world.s3.url}/media/customer-1/speech.wav")
    assert job.audio_seconds == pytest.approx(1.5, abs=0.05)
    job = world.acme.wait(job.id)
    assert job.state == SUCCEEDED, job.error

    issued = time.time()
    link = world.acme.get_output_url(job.id)
    assert issued - 1 < link.expires_at.timestamp() <= issued + URL_TTL_S + 1
    with urllib.request.urlopen(link.url, timeout=10) as response:
        body = response.read()
    assert hashlib.sha256(body).hexdigest() == job.output_sha256 and len(body) == job.output_bytes
    assert body[4:8] == b"ftyp"  # an MP4
    world.acme.download(job.id, tmp_path / "out.mp4")
    assert (tmp_path / "out.mp4").read_bytes() == body  # the same bytes as through the gateway

    # Another tenant's job is NOT_FOUND, as for every RPC.
    assert refused(lambda: world.bob.get_output_url(job.id)).code() == grpc.StatusCode.NOT_FOUND

    # The URL carries its own expiry (SigV4: signed at X-Amz-Date, for X-Amz-Expires seconds), which S3
    # enforces; moto's server does not, so the test checks what S3 would read.
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(link.url).query)
    signed_at = datetime.datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    assert int(query["X-Amz-Expires"][0]) == int(URL_TTL_S)
    assert abs((signed_at + datetime.timedelta(seconds=URL_TTL_S) - link.expires_at).total_seconds()) < 2


def test_audio_uri_refusals_from_the_bucket(world: World, avatar: gateway_pb2.Avatar) -> None:
    submit = world.acme.submit_job
    world.bucket.put("media/too-big.wav", b"\0" * (MAX_AUDIO_BYTES + 1))
    cases = {
        "s3://some-other-bucket/speech.wav": (grpc.StatusCode.INVALID_ARGUMENT, "not the blob store's bucket"),
        f"{world.s3.url}/media/missing.wav": (grpc.StatusCode.NOT_FOUND, "no such object"),
        f"{world.s3.url}/media/too-big.wav": (grpc.StatusCode.RESOURCE_EXHAUSTED, "max_audio_bytes"),
        f"{world.s3.url}/media/../x.wav": (grpc.StatusCode.INVALID_ARGUMENT, "segments are not allowed"),
        "ftp://example.com/speech.wav": (grpc.StatusCode.INVALID_ARGUMENT, "use s3://"),
    }
    for uri, (code, words) in cases.items():
        error = refused(lambda uri=uri: submit(avatar.id, audio_uri=uri))
        assert (error.code(), words in error.details()) == (code, True), (uri, error.details())
    both = refused(lambda: submit(avatar.id, world.speech, audio_uri=f"{world.s3.url}/media/x.wav"))
    assert both.code() == grpc.StatusCode.INVALID_ARGUMENT and "not both" in both.details()


def test_audio_from_an_allowed_https_host(world: World, avatar: gateway_pb2.Avatar) -> None:
    for path in ("/speech.wav", "/moved"):  # a redirect on the same (allowed) host is followed
        job = world.acme.submit_job(avatar.id, audio_uri=world.host.base + path)
        assert job.audio_seconds == pytest.approx(1.5, abs=0.05)
        world.acme.cancel_job(job.id)  # fetched and checked: that is what this test is about


def test_audio_uri_refusals_from_https(world: World, avatar: gateway_pb2.Avatar) -> None:
    base, port = world.host.base, world.host.server_address[1]
    cases = {
        f"https://127.0.0.1:{port}/speech.wav": (
            grpc.StatusCode.INVALID_ARGUMENT,
            "not on this gateway's audio_uri_hosts",
        ),
        f"{base}/away": (grpc.StatusCode.INVALID_ARGUMENT, "redirected to"),
        f"{base}/plain": (grpc.StatusCode.INVALID_ARGUMENT, "only https:// is allowed"),
        f"http://localhost:{port}/speech.wav": (grpc.StatusCode.INVALID_ARGUMENT, "use s3://"),
        f"{base}/nothing-here.wav": (grpc.StatusCode.NOT_FOUND, "404"),
        f"{base}/big": (grpc.StatusCode.RESOURCE_EXHAUSTED, "max_audio_bytes"),
        f"{base}/big-chunked": (grpc.StatusCode.RESOURCE_EXHAUSTED, "max_audio_bytes"),
        f"{base}/slow": (grpc.StatusCode.DEADLINE_EXCEEDED, "audio_uri_timeout_s"),
        f"{base}/broken": (grpc.StatusCode.UNAVAILABLE, "503"),
        f"{base}/noise": (grpc.StatusCode.INVALID_ARGUMENT, ""),  # fetched, then the audio stage's own checks
    }
    for uri, (code, words) in cases.items():
        error = refused(lambda uri=uri: world.acme.submit_job(avatar.id, audio_uri=uri))
        assert (error.code(), words in error.details()) == (code, True), (uri, error.details())
    assert world.cluster.processes["gateway"].process.poll() is None  # and the gateway is still up


def test_get_output_url_on_a_folder_store_says_to_download(
    cluster: LocalCluster, client: LiplineClient, avatar_bytes: bytes, speech_bytes: bytes
) -> None:
    avatar = client.create_avatar(avatar_bytes)
    job = client.wait(client.submit_job(avatar.id, cut_wav(speech_bytes, 0.8)).id)
    assert job.state == SUCCEEDED
    error = refused(lambda: client.get_output_url(job.id))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "use DownloadOutput" in error.details()
    queued = client.submit_job(avatar.id, cut_wav(speech_bytes, 0.8))
    client.cancel_job(queued.id)
    error = refused(lambda: client.get_output_url(queued.id))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "SUCCEEDED" in error.details()


def test_an_output_url_stops_working_once_it_expires(tmp_path: Path, avatar_bytes: bytes) -> None:
    """GetOutputUrl against s3rver, an S3 server that enforces presigned expiry (moto does not): the URL
    downloads the MP4 (the same bytes as DownloadOutput) until expire_time, then S3 refuses it."""
    with (
        S3rver() as s3,
        start_cluster(
            tmp_path / "cluster",
            blob_store=f"{s3.url}/lipline",
            env=s3.env,
            extra_args={"gateway": ["--output-url-ttl-s=3"]},
        ) as cluster,
        LiplineClient(cluster.gateway_address, timeout=120) as client,
    ):
        avatar = client.create_avatar(avatar_bytes)
        job = client.wait(client.submit_job(avatar.id, cut_wav((SAMPLES / "speech.wav").read_bytes(), 0.8)).id)
        assert job.state == SUCCEEDED, job.error
        link = client.get_output_url(job.id)
        with urllib.request.urlopen(link.url, timeout=10) as response:
            body = response.read()
        client.download(job.id, tmp_path / "out.mp4")
        assert body == (tmp_path / "out.mp4").read_bytes() and body[4:8] == b"ftyp"
        time.sleep(max(0.0, link.expires_at.timestamp() - time.time()) + 1.5)
        with pytest.raises(urllib.error.HTTPError) as refused_after:
            urllib.request.urlopen(link.url, timeout=10)
        assert refused_after.value.code == 403 and b"Request has expired" in refused_after.value.read()
