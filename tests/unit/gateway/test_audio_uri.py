"""AudioFetcher (services.gateway.audio_uri) on a folder blob store, against an https server on
127.0.0.1 (asyncio, a self-signed certificate the fetcher is told to trust): `check` refuses a URL
two parsers could read differently before any I/O, and `fetch` sends the very URL it checked, byte
for byte (issue 29 item 3)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
import typing
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.gateway.audio_uri import AudioFetcher
from services.gateway.settings import GatewaySettings
from services.gateway.urls import CheckedUrl
from services.serving.errors import InvalidRequest
from tests.helpers.certificates import make_certificate
from tests.helpers.stores import Stores, temp_stores


@dataclasses.dataclass
class Host:
    """An https server: `/redirect/<n>` answers 302 to the nth of REDIRECTS, anything else 200 "audio";
    `lines` holds every request line it read."""

    port: int
    lines: list[bytes] = dataclasses.field(default_factory=list)


REDIRECTS = {
    "backslash": "https://localhost:{port}\\@127.0.0.1:{port}/x",
    "tab": "/a\tb",
    "fullwidth": "https://localhost\uff0e:{port}/x",
    "encoded": "/a%5Cb",
    "plain": "/sent%2Fas;v=1/written?x=%2F",
}


@contextlib.asynccontextmanager
async def https_host(cert: Path, key: Path) -> AsyncIterator[Host]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    host = Host(0)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        host.lines.append(line)
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        target = line.split(b" ")[1].decode()
        if target.startswith("/redirect/"):
            location = REDIRECTS[target.rsplit("/", 1)[1]].format(port=host.port)
            writer.write(f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode())
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\naudio")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    host.port = server.sockets[0].getsockname()[1]
    async with server:
        yield host


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    with temp_stores(tmp_path) as s:
        yield s


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_certificate(tmp_path_factory.mktemp("tls"))


def fetcher(stores: Stores, hosts: str, cert: Path | None = None) -> AudioFetcher:
    settings = GatewaySettings(audio_uri_hosts=hosts, audio_uri_ca_file=str(cert) if cert else "")
    return AudioFetcher(settings, stores.blobs)


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("https://localhost:8443\\@media.example.com/x.wav", "a backslash is not allowed"),
        ("https://media.example.com/a%5Cb.wav", "encodes a backslash"),
        ("https://media.example.com/x.wav\r\n", "tabs and line breaks"),
        ("https://media.exa\tmple.com/x.wav", "tabs and line breaks"),
        ("https://user:pw@media.example.com/x.wav", "user name or password"),
        ("https://[fe80::1%25eth0]/x.wav", "IPv6 zone id"),
        ("https://media\uff0eexample.com/x.wav", "U+FF0E"),
        ("https://media\u3002example.com/x.wav", "U+3002"),
        ("https://media.example.com./x.wav", "ends with '.'"),
        ("https://media.example.com/x.wav#t=1", "a fragment"),
        ("http://media.example.com/x.wav", "use s3://"),
        ("https://other.example.com/x.wav", "not on this gateway's audio_uri_hosts (media.example.com:443)"),
        ("https://media.example.com:8443/x.wav", "not on this gateway's audio_uri_hosts"),
        ("s3://bucket/x.wav", "this gateway's blob store is not on S3"),
    ],
)
def test_check_refuses_before_any_io_naming_the_reason(stores: Stores, uri: str, says: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        fetcher(stores, "media.example.com").check(uri)
    assert caught.value.args[0].startswith("audio_uri ") and says in str(caught.value)


def test_https_uris_are_off_without_a_host_list(stores: Stores) -> None:
    with pytest.raises(InvalidRequest, match="https audio URIs are off on this gateway"):
        fetcher(stores, "").check("https://media.example.com/x.wav")


def test_the_fetch_takes_the_checked_url_not_a_string() -> None:
    assert typing.get_type_hints(AudioFetcher.fetch)["source"] is CheckedUrl
    assert typing.get_type_hints(AudioFetcher.check)["return"] is CheckedUrl


def test_what_is_fetched_is_what_was_checked_byte_for_byte(stores: Stores, certificate: tuple[Path, Path]) -> None:
    async def run() -> None:
        async with https_host(*certificate) as host:
            audio = fetcher(stores, f"localhost:{host.port}", certificate[0])
            try:
                checked = audio.check(f"https://localhost:{host.port}/a/../b%2Fc;v=1?sig=a%2Fb%3D&e=%20")
                assert await audio.fetch(checked) == b"audio"
                # a redirect's target is parsed and checked like the URI: sent as written too
                assert await audio.fetch(audio.check(f"https://localhost:{host.port}/redirect/plain")) == b"audio"
            finally:
                await audio.close()
            assert host.lines == [
                b"GET /a/../b%2Fc;v=1?sig=a%2Fb%3D&e=%20 HTTP/1.1\r\n",
                b"GET /redirect/plain HTTP/1.1\r\n",
                b"GET /sent%2Fas;v=1/written?x=%2F HTTP/1.1\r\n",
            ]

    asyncio.run(run())


@pytest.mark.parametrize("redirect", ["backslash", "tab", "fullwidth", "encoded"])
def test_a_redirect_two_parsers_read_differently_is_invalid_argument_not_retry_later(
    stores: Stores, certificate: tuple[Path, Path], redirect: str
) -> None:
    async def run() -> None:
        async with https_host(*certificate) as host:
            audio = fetcher(stores, f"localhost:{host.port},127.0.0.1:{host.port}", certificate[0])
            try:
                with pytest.raises(InvalidRequest, match="redirected to") as caught:
                    await audio.fetch(audio.check(f"https://localhost:{host.port}/redirect/{redirect}"))
            finally:
                await audio.close()
            assert len(host.lines) == 1, caught.value  # the target was never requested

    asyncio.run(run())
