"""The URLs the gateway fetches and calls, through a real gateway process on 127.0.0.1, on the SQLite
and the PostgreSQL job store (issue 29 items 3 and 5).

- One parser: a URL that two parsers could read differently (a backslash, %5C, a tab or line break,
  user:pass@, an IPv6 zone id, a look-alike dot, a trailing dot) is INVALID_ARGUMENT, saying why,
  for `audio_uri` and `callback_url` alike, and the audio host is never asked.
- Idempotency by the request as sent: a SubmitJob retried with its request_id after the file behind
  its audio_uri changed is the job the first made (the URI is not fetched again); another URI with
  the same request_id is still another request.

The audio host is an https server in a thread (a self-signed certificate the gateway is told to
trust); no render worker runs, so jobs stay queued and nothing renders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import secrets
import ssl
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from lipline.v1 import gateway_pb2
from lipline_client import NO_RETRY
from services.gateway.client import LiplineClient
from tests.helpers.certificates import make_certificate
from tests.integration.util import SAMPLES, cut_wav, start_cluster

SPEECH = (SAMPLES / "speech.wav").read_bytes()


class AudioHost(http.server.ThreadingHTTPServer):
    """https on 127.0.0.1: `/speech.wav` and `/other.wav` serve `audio` (the test may change it);
    every request's path is kept in `paths`."""

    daemon_threads = True

    def __init__(self, cert: Path, key: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.audio = cut_wav(SPEECH, 0.8)
        self.paths: list[str] = []
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return self.server_address[1]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: AudioHost

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.paths.append(self.path)
            body = self.server.audio
        status = 200 if self.path.split("?")[0] in ("/speech.wav", "/other.wav") else 404
        self.send_response(status)
        self.send_header("Content-Length", str(len(body) if status == 200 else 0))
        self.end_headers()
        if status == 200:
            self.wfile.write(body)


@dataclasses.dataclass
class World:
    host: AudioHost
    acme: LiplineClient
    avatar: gateway_pb2.Avatar
    receiver_port: int  # the only port callback_http_hosts lists (127.0.0.1); nothing is delivered here


@pytest.fixture(scope="module")
def world(job_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("outbound-urls")
    cert, key = make_certificate(workdir)
    api_key = secrets.token_urlsafe(24)
    (workdir / "api-keys").write_text(f"acme/ci:{api_key}\n")
    (workdir / "webhook-secrets").write_text(f"acme:{secrets.token_urlsafe(32)}\n")
    with contextlib.ExitStack() as stack:
        host = AudioHost(cert, key)
        threading.Thread(target=host.serve_forever, daemon=True).start()
        stack.callback(host.server_close)
        stack.callback(host.shutdown)
        receiver_port = host.port + 1 if host.port < 65535 else host.port - 1  # listed only, never called
        gateway = [
            f"--api-keys-file={workdir / 'api-keys'}",
            f"--webhook-secrets-file={workdir / 'webhook-secrets'}",
            f"--audio-uri-hosts=localhost:{host.port},127.0.0.1:{host.port}",
            f"--audio-uri-ca-file={cert}",
            f"--callback-http-hosts=127.0.0.1:{receiver_port}",
            f"--callback-hosts=localhost:{receiver_port}",
        ]
        cluster = stack.enter_context(
            start_cluster(
                workdir / "cluster", job_store=job_store_url, extra_args={"gateway": gateway}, replicas={"render": 0}
            )
        )
        acme = stack.enter_context(LiplineClient(cluster.gateway_address, timeout=60, api_key=api_key, retry=NO_RETRY))
        avatar = acme.create_avatar((SAMPLES / "avatar.jpg").read_bytes(), name="a.jpg")
        yield World(host, acme, avatar, receiver_port)


# Each case: a template ({scheme}, {host} = the listed 127.0.0.1, {port} = its port) and what the refusal says.
TWO_READINGS = {
    # the issue's URL: urllib read host {host}:{port} (listed), yarl refuses it
    "backslash in the authority": ("{scheme}://127.0.0.1:1\\@{host}:{port}/x", "a backslash is not allowed"),
    "backslash in the path": ("{scheme}://{host}:{port}/a\\b", "a backslash is not allowed"),
    "%5C in the path": ("{scheme}://{host}:{port}/a%5Cb", "encodes a backslash"),
    "%5C in the authority": ("{scheme}://127.0.0.1:1%5C@{host}:{port}/x", "encodes a backslash"),
    "tab": ("{scheme}://{host}:{port}/spe\tech.wav", "tabs and line breaks"),
    "tab in the host": ("{scheme}://127.0.0.\t1:{port}/x", "tabs and line breaks"),
    "CR LF": ("{scheme}://{host}:{port}/x\r\nX-Injected: 1", "tabs and line breaks"),
    "LF": ("{scheme}://{host}:{port}/x\n", "tabs and line breaks"),
    "user and password": ("{scheme}://user:pw@{host}:{port}/x", "user name or password"),
    "user": ("{scheme}://user@{host}:{port}/x", "user name or password"),
    "IPv6 zone id": ("{scheme}://[fe80::1%25eth0]:{port}/x", "IPv6 zone id"),
    "full-width dots": ("{scheme}://127\uff0e0\uff0e0\uff0e1:{port}/x", "U+FF0E"),
    "ideographic full stops": ("{scheme}://127\u30020\u30020\u30021:{port}/x", "U+3002"),
    "halfwidth ideographic full stops": ("{scheme}://127\uff610\uff610\uff611:{port}/x", "U+FF61"),
    "a trailing dot": ("{scheme}://{host}.:{port}/x", "ends with '.'"),
}


def refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), caught.value.details() or ""


@pytest.mark.parametrize("case", sorted(TWO_READINGS))
def test_a_url_two_parsers_read_differently_is_invalid_argument_for_audio_uri_and_callback_url(
    world: World, case: str
) -> None:
    template, says = TWO_READINGS[case]
    before = len(world.host.paths)
    audio_uri = template.format(scheme="https", host="127.0.0.1", port=world.host.port)
    code, details = refusal(lambda: world.acme.submit_job(world.avatar.id, audio_uri=audio_uri))
    assert (code, says in details, details.startswith("audio_uri ")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        True,
        True,
    ), details
    callback_url = template.format(scheme="http", host="127.0.0.1", port=world.receiver_port)
    speech = cut_wav(SPEECH, 0.4)
    code, details = refusal(lambda: world.acme.submit_job(world.avatar.id, speech, callback_url=callback_url))
    assert (code, says in details, details.startswith("callback_url ")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        True,
        True,
    ), details
    assert len(world.host.paths) == before  # refused before anything was fetched


def test_the_issues_callback_url_is_refused_at_submit_not_given_up_on_later(world: World) -> None:
    """http://127.0.0.1:P6\\@127.0.0.1:P5/hook, P5 listed: urllib saw P5 and accepted it, then every
    delivery failed in aiohttp until GAVE_UP. Now SubmitJob says what is wrong."""
    url = f"http://127.0.0.1:{world.host.port}\\@127.0.0.1:{world.receiver_port}/hook"
    code, details = refusal(lambda: world.acme.submit_job(world.avatar.id, cut_wav(SPEECH, 0.4), callback_url=url))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "backslash" in details
    # the same URL written plainly is accepted (the check is not a blanket refusal)
    job = world.acme.submit_job(
        world.avatar.id, cut_wav(SPEECH, 0.4), callback_url=f"http://127.0.0.1:{world.receiver_port}/hook"
    )
    world.acme.cancel_job(job.id)


def test_a_retry_after_the_audio_uris_file_changed_returns_the_original_job(world: World) -> None:
    request_id = str(uuid.uuid4())
    uri = f"https://localhost:{world.host.port}/speech.wav"
    first = world.acme.submit_job(world.avatar.id, audio_uri=uri, request_id=request_id)
    fetches = world.host.paths.count("/speech.wav")
    assert fetches >= 1
    with world.host.lock:
        world.host.audio = cut_wav(SPEECH, 1.2)  # the backend replaced the file behind the URI
    again = world.acme.submit_job(world.avatar.id, audio_uri=uri, request_id=request_id)
    assert (again.id, again.audio_seconds) == (first.id, first.audio_seconds)
    assert world.host.paths.count("/speech.wav") == fetches  # the retry did not fetch it again
    # Another URI (even to the same bytes) with the same request_id is another request.
    other = f"https://localhost:{world.host.port}/other.wav"
    code, details = refusal(lambda: world.acme.submit_job(world.avatar.id, audio_uri=other, request_id=request_id))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"request_id {request_id} was already used for a different job request" in details
    assert "/other.wav" not in world.host.paths  # refused before a fetch
    world.acme.cancel_job(first.id)
