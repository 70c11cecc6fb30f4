"""The web server against a careless store and a hostile page, with real processes on 127.0.0.1.

A damaged output (bytes changed in the blob store, its size unchanged) is never served as a complete
download: the gateway ends DownloadOutput DATA_LOSS after its last chunk, and the web server, one
chunk behind, answers 502 when it has sent nothing yet, or cuts the transfer short of its
Content-Length, and writes nothing more on the connection (read here on a raw keep-alive socket, as
an ingress would). An intact download still streams (the web server's peak memory stays far below
the output's size). Every response carries the security headers, and the live WebSocket opens only
for the configured public origins, whatever Host the request names (a DNS-rebinding page's does);
without API keys (local mode), the API answers only at the page's own address.

The cluster runs no render worker: the jobs are finished in the job store directly (util.finish_job),
with outputs of noise of a chosen size. Its gateway checks no keys, so any key passes the web server's
check for one.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
import websocket

from services.jobs.layout import output_key
from services.jobs.store import open_job_store
from services.jobs.store.jobs import JobStore
from services.local.cluster import LOCAL_FLAGS, LocalCluster
from services.local.process import start
from tests.integration.util import finish_job, new_job, rss_mb, start_cluster

MiB = 1 << 20
PUBLIC_ORIGIN = "https://try.lipline.example"
KEY = "any-key"  # the gateway checks none; the web server wants one sent
SECURITY_HEADERS = ("content-security-policy", "x-frame-options", "x-content-type-options", "referrer-policy")


@dataclass
class Site:
    cluster: LocalCluster
    store: JobStore

    @property
    def url(self) -> str:
        return self.cluster.web_url

    def job(self, output: bytes) -> str:
        """A SUCCEEDED job whose stored output is `output` (its size and sha256 recorded)."""
        job_id = new_job(self.store)
        finish_job(self.store, job_id, output, self.cluster.blob_store)
        return job_id

    def damage(self, job_id: str) -> bytes:
        """64 bytes changed in the middle of the stored output, its size unchanged; the damaged bytes."""
        path = self.cluster.blob_dir / output_key(job_id)
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
        path.write_bytes(data)
        return bytes(data)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    web = [f"--public-origins={PUBLIC_ORIGIN}"]
    with start_cluster(
        tmp_path_factory.mktemp("web-hardening"), extra_args={"web": web}, replicas={"render": 0, "web": 1}
    ) as cluster:
        store = open_job_store(cluster.job_store)
        try:
            yield Site(cluster, store)
        finally:
            store.close()


def noise(size: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes
    complete: bool  # the body reached its Content-Length (or the chunked terminator)


@dataclass
class Connection:
    """One keep-alive HTTP/1.1 connection on a raw socket, read byte for byte as a proxy would: what the
    server wrote on it, and whether it closed."""

    url: str
    received: bytearray = field(default_factory=bytearray)
    closed: bool = False

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        self.host = parts.netloc
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
        self._buffer = bytearray()

    def close(self) -> None:
        self.sock.close()

    def get(self, path: str) -> Answer:
        request = f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\nX-Api-Key: {KEY}\r\nConnection: keep-alive\r\n\r\n"
        self.sock.sendall(request.encode())
        return self._answer()

    def _more(self) -> bool:
        if self.closed:
            return False
        data = self.sock.recv(1 << 16)
        if not data:
            self.closed = True
            return False
        self.received += data
        self._buffer += data
        return True

    def _take(self, n: int) -> bytes:
        """Up to n bytes (fewer when the connection closes first)."""
        while len(self._buffer) < n and self._more():
            pass
        taken = bytes(self._buffer[:n])
        del self._buffer[:n]
        return taken

    def _line(self) -> bytes | None:
        while (end := self._buffer.find(b"\r\n")) < 0:
            if not self._more():
                return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 2]
        return line

    def _answer(self) -> Answer:
        status_line = self._line()
        assert status_line is not None, "the connection closed without an answer"
        status = int(status_line.split()[1])
        headers = {}
        while line := self._line():
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            length = int(headers["content-length"])
            body = self._take(length)
            return Answer(status, headers, body, len(body) == length)
        assert headers.get("transfer-encoding") == "chunked", headers
        body = bytearray()
        while (size_line := self._line()) is not None:
            size = int(size_line.split(b";")[0], 16)
            chunk = self._take(size + 2)
            if len(chunk) < size + 2:
                body += chunk[:size]
                break
            if size == 0:
                return Answer(status, headers, bytes(body), True)
            body += chunk[:size]
        return Answer(status, headers, bytes(body), False)

    def read_to_close(self) -> None:
        while self._more():
            pass


def config_answer(answer: Answer) -> bool:
    return answer.status == 200 and answer.complete and "max_audio_bytes" in json.loads(answer.body)


def test_a_damaged_output_of_several_chunks_is_a_failed_transfer_and_nothing_follows_it(site: Site) -> None:
    """Damaged past the first chunk: the answer (200, its headers sent with the first chunks) is cut
    short of its Content-Length, what came is the stored bytes as they are, and the server writes
    nothing more: one status line on the connection, then its close."""
    output = noise(3 * MiB + 12345, seed=1)
    job_id = site.job(output)
    damaged = site.damage(job_id)
    connection = Connection(site.url)
    try:
        answer = connection.get(f"/api/jobs/{job_id}/output")
        assert answer.status == 200 and int(answer.headers["content-length"]) == len(output)
        assert not answer.complete, "a damaged output was served as a complete download"
        assert 0 < len(answer.body) < len(output)
        assert answer.body == damaged[: len(answer.body)], "only the output's own bytes come, nothing after them"
        connection.read_to_close()
        assert connection.closed
        assert connection.received.count(b"HTTP/1.1 ") == 1, "a second answer was written on the connection"
    finally:
        connection.close()
    # A plain HTTP client sees the failure too.
    with pytest.raises(http.client.IncompleteRead):
        request = urllib.request.Request(f"{site.url}/api/jobs/{job_id}/output", headers={"X-Api-Key": KEY})
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
    log = site.cluster.processes["web"].log()
    assert "download cut" in log and "DATA_LOSS" in log and "Traceback" not in log


def test_a_damaged_output_of_one_chunk_is_a_502_before_any_byte_and_the_connection_goes_on(site: Site) -> None:
    output = noise(300_000, seed=2)
    job_id = site.job(output)
    site.damage(job_id)
    connection = Connection(site.url)
    try:
        answer = connection.get(f"/api/jobs/{job_id}/output")
        assert answer.status == 502 and answer.complete, answer
        error = json.loads(answer.body)
        assert error["code"] == "DATA_LOSS" and "checksum mismatch" in error["error"] and job_id in error["error"]
        # The next request on the same connection gets its own answer: nothing stray came before it.
        assert config_answer(connection.get("/api/config"))
    finally:
        connection.close()


def test_an_intact_download_is_whole_keeps_the_connection_and_streams_without_holding_the_output(site: Site) -> None:
    """The web server's peak memory while it serves a 64 MiB output grows by far less than the output:
    it holds one gateway chunk, not the file (the old code streamed too; this keeps it so)."""
    output = noise(64 * MiB, seed=3)
    job_id = site.job(output)
    pid = site.cluster.processes["web"].process.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS: the peak from here on
    before = rss_mb(pid)
    connection = Connection(site.url)
    try:
        answer = connection.get(f"/api/jobs/{job_id}/output")
        assert answer.status == 200 and answer.complete
        assert hashlib.sha256(answer.body).digest() == hashlib.sha256(output).digest()
        assert answer.headers["content-type"] == "video/mp4"
        assert config_answer(connection.get("/api/config")), "the connection goes on after a download"
    finally:
        connection.close()
    growth = rss_mb(pid, "VmHWM") - before
    print(f"web server's peak memory over its resident size before a 64 MiB download: {growth:.1f} MiB")
    assert growth < 32, f"the web server's peak grew by {growth:.0f} MiB for a 64 MiB download"


def test_every_response_carries_the_security_headers(site: Site) -> None:
    """The page, a static file, an API answer, an API refusal and the WebSocket's handshake."""
    connection = Connection(site.url)
    try:
        answers = {path: connection.get(path) for path in ("/", "/static/main.js", "/api/config", "/api/jobs/x/output")}
    finally:
        connection.close()
    assert answers["/"].status == 200 and answers["/static/main.js"].status == 200
    assert answers["/api/jobs/x/output"].status in {400, 404}
    ws = websocket.create_connection(f"{ws_url(site)}/api/live", origin=PUBLIC_ORIGIN, timeout=30)
    handshake = {k.lower(): v for k, v in ws.getheaders().items()}
    ws.close()
    for headers in [*(a.headers for a in answers.values()), handshake]:
        assert all(name in headers for name in SECURITY_HEADERS), headers
        csp = {d.split()[0]: d.split()[1:] for d in headers["content-security-policy"].split("; ")}
        assert csp["default-src"] == ["'none'"] and csp["script-src"] == ["'self'"]
        assert csp["connect-src"] == ["'self'"] and csp["frame-ancestors"] == ["'none'"]
        assert headers["x-frame-options"] == "DENY"
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "no-referrer"
    assert "javascript" in answers["/static/main.js"].headers["content-type"]  # nosniff needs the right type


def ws_url(site: Site) -> str:
    return site.url.replace("http://", "ws://")


def handshake_status(site: Site, origin: str, host: str | None = None) -> int:
    """The live WebSocket's handshake status for a page of `origin` (Host: `host`, else the server's)."""
    try:
        ws = websocket.create_connection(f"{ws_url(site)}/api/live", origin=origin, host=host, timeout=30)
    except websocket.WebSocketBadStatusException as exc:
        return exc.status_code
    try:
        ws.send(json.dumps({"type": "start"}))  # no avatar: the bridge's own refusal, past the handshake
        assert json.loads(ws.recv())["code"] == "INVALID_ARGUMENT"
    finally:
        ws.close()
    return 101


def test_the_live_socket_opens_for_the_public_origins_only_whatever_host_the_request_names(site: Site) -> None:
    port = urlsplit(site.url).port
    refused_before = refused_for_origin(site)
    assert handshake_status(site, PUBLIC_ORIGIN) == 101
    # A DNS-rebinding page: its name now points here, its Origin and its Host agree; still refused.
    assert handshake_status(site, f"http://rebind.example:{port}", host=f"rebind.example:{port}") == 403
    # With public origins set, the loopback ones are no longer the page's: the Host alone proves nothing.
    assert handshake_status(site, site.url) == 403
    assert handshake_status(site, "null") == 403
    assert refused_for_origin(site) == refused_before + 3


def refused_for_origin(site: Site) -> float:
    """lipline_web_live_refused_total{reason="origin"} on the web server's /metrics."""
    url = f"http://127.0.0.1:{site.cluster.processes['web'].metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith('lipline_web_live_refused_total{reason="origin"}'):
                return float(line.split()[-1])
    return 0.0


def test_without_api_keys_the_api_answers_only_at_the_pages_own_address(
    site: Site, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Local mode's web server (no keys, no public origins: the page is at http://127.0.0.1:<port>):
    a DNS-rebinding page, which no key stops there, gets 403 for its API calls, its Host being its own name."""
    keyless = start(
        "web-keyless",
        "web",
        [f"--gateway-address={site.cluster.gateway_address}", "--require-api-key=false", "--http-port=0"],
        tmp_path_factory.mktemp("web-keyless"),
        base_args=LOCAL_FLAGS,
    )
    try:
        keyless.wait_ready(60)
        port = keyless.http_port

        def status(path: str, host: str) -> int:
            connection = Connection(keyless.url)
            connection.host = host
            try:
                return connection.get(path).status
            finally:
                connection.close()

        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
            assert status("/api/config", host) == 200, host
        assert status("/api/avatars", f"127.0.0.1:{port}") == 200
        for host in (f"rebind.example:{port}", "rebind.example", f"127.0.0.1:{port + 1}"):
            assert status("/api/avatars", host) == 403, host
        assert status("/", f"rebind.example:{port}") == 200  # the page itself holds nothing
    finally:
        keyless.terminate()
