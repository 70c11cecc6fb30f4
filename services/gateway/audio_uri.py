"""SubmitJobRequest.audio_uri: the gateway fetches the audio a backend keeps in object storage.

Two kinds of URI, both bounded by the same byte limit as an upload (max_audio_bytes) and by one
time limit for the whole fetch (audio_uri_timeout_s); the bytes then take the uploaded bytes' path
(the audio stage's decode, checks and limits), so a URI is never more than a way to deliver them:

- `s3://<bucket>/<key>`: only in the blob store's own bucket, when the blob store is on S3, with
  the gateway's own S3 credentials and endpoint (the AWS_* settings). Any other bucket is refused:
  the gateway's credentials must not become a way to read what the caller could not.
- `https://<host>[:port]/...`: only hosts the operator lists in audio_uri_hosts (`host` means port
  443, `host:port` that port). Redirects are followed (at most MAX_REDIRECTS) only to listed hosts
  and only over https, so an allowed host cannot bounce the gateway to an internal address. The
  server's certificate is checked against the system's roots, or audio_uri_ca_file's.

Each refusal names what to change: INVALID_ARGUMENT (scheme, bucket, host, a redirect), NOT_FOUND
(nothing there), RESOURCE_EXHAUSTED (over max_audio_bytes), DEADLINE_EXCEEDED (too slow),
UNAVAILABLE (the host or S3 cannot be reached or answered 5xx: retry), FAILED_PRECONDITION (the
host's certificate is not trusted).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.parse

import aiohttp

from services.gateway.settings import GatewaySettings
from services.jobs.store.blobs import BlobStore, check_key
from services.serving.errors import (
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    NotReady,
    TimedOut,
    TooLarge,
)

MAX_REDIRECTS = 5
MAX_URI_CHARS = 2048
_READ_CHUNK = 64 * 1024


def allowed_hosts(setting: str, default_port: int = 443) -> frozenset[str]:
    """A host list setting (`a.example.com,b.example.com:8443`: audio_uri_hosts, callback_hosts) as
    `host:port` entries, lowercase; `default_port` for an entry without a port."""
    hosts = set()
    for entry in filter(None, (e.strip().lower() for e in setting.split(","))):
        host, _, port = entry.rpartition(":") if entry.rsplit(":", 1)[-1].isdigit() else (entry, "", str(default_port))
        hosts.add(f"{host}:{port}")
    return frozenset(hosts)


class AudioFetcher:
    """Fetches audio_uri's bytes for SubmitJob; one per gateway (it holds an HTTP session and an S3 reader)."""

    def __init__(self, settings: GatewaySettings, blobs: BlobStore) -> None:
        self._settings = settings
        self._blobs = blobs
        self._hosts = allowed_hosts(settings.audio_uri_hosts)
        self._ssl = ssl.create_default_context(cafile=settings.audio_uri_ca_file or None)
        self._session: aiohttp.ClientSession | None = None
        self._bucket_store: BlobStore | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._bucket_store is not None:
            self._bucket_store.close()

    async def fetch(self, uri: str) -> bytes:
        """The bytes at `uri` (see the module's doc for what is allowed and what each refusal is)."""
        if len(uri) > MAX_URI_CHARS:
            raise InvalidRequest(f"audio_uri is {len(uri)} characters; the limit is {MAX_URI_CHARS}")
        parts = urllib.parse.urlsplit(uri)
        timeout = self._settings.audio_uri_timeout_s
        try:
            async with asyncio.timeout(timeout):
                if parts.scheme == "s3":
                    return await self._fetch_s3(uri, parts)
                if parts.scheme == "https":
                    return await self._fetch_https(uri)
        except TimeoutError:
            raise TimedOut(
                f"fetching audio_uri {uri} took longer than {timeout:g} s (audio_uri_timeout_s); "
                "make it faster to serve or send the bytes"
            ) from None
        raise InvalidRequest(
            f"audio_uri {uri[:200]!r}: use s3://<bucket>/<key> (the blob store's bucket) or https://<allowed host>/<path>"
        )

    # -- S3 ---------------------------------------------------------------------------------------

    async def _fetch_s3(self, uri: str, parts: urllib.parse.SplitResult) -> bytes:
        store_url = self._blobs.url
        if not store_url.startswith("s3://"):
            raise InvalidRequest(
                f"audio_uri {uri}: this gateway's blob store is not on S3, so it reads no s3:// URIs; send the bytes or an https:// URI"
            )
        bucket = urllib.parse.urlsplit(store_url).netloc
        if parts.netloc != bucket:
            raise InvalidRequest(
                f"audio_uri {uri}: bucket {parts.netloc!r} is not the blob store's bucket {bucket!r}, the only one this gateway reads"
            )
        key = urllib.parse.unquote(parts.path.lstrip("/"))
        try:
            check_key(key)
        except ValueError as e:
            raise InvalidRequest(f"audio_uri {uri}: {e}") from None
        reader = self._bucket_reader(bucket)
        limit = self._settings.max_audio_bytes
        try:
            size = await asyncio.to_thread(reader.size, key)
            if size > limit:
                raise TooLarge(f"audio_uri {uri} is {size} bytes; the limit is {limit} (max_audio_bytes)")
            data = await asyncio.to_thread(reader.get, key)
        except NotFound:
            raise NotFound(f"audio_uri {uri}: no such object in bucket {bucket!r}") from None
        if len(data) > limit:  # replaced between the size and the read
            raise TooLarge(f"audio_uri {uri} is over {limit} bytes (max_audio_bytes)")
        return data

    def _bucket_reader(self, bucket: str) -> BlobStore:
        """The blob store's bucket without its prefix (a backend's keys are its own), same credentials."""
        if self._bucket_store is None:
            from services.jobs.store import open_blob_store

            self._bucket_store = open_blob_store(f"s3://{bucket}")
        return self._bucket_store

    # -- https ------------------------------------------------------------------------------------

    def _check_host(self, url: str, what: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "https":
            raise InvalidRequest(f"{what} {url[:200]}: only https:// is allowed")
        try:
            port = parts.port or 443
        except ValueError:
            raise InvalidRequest(f"{what} {url[:200]}: the port is not a number") from None
        host = f"{(parts.hostname or '').lower()}:{port}"
        if host not in self._hosts:
            listed = ", ".join(sorted(self._hosts)) or "none: https audio URIs are off"
            raise InvalidRequest(
                f"{what} {url[:200]}: host {host} is not on this gateway's audio_uri_hosts ({listed}); "
                "ask its operator to allow it, or send the bytes"
            )

    async def _fetch_https(self, uri: str) -> bytes:
        url, what = uri, "audio_uri"
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl), trust_env=False)
        for _ in range(MAX_REDIRECTS + 1):
            self._check_host(url, what)
            try:
                async with self._session.get(url, allow_redirects=False) as response:
                    if response.status in (301, 302, 303, 307, 308) and "Location" in response.headers:
                        url, what = (
                            urllib.parse.urljoin(url, response.headers["Location"]),
                            f"audio_uri {uri} redirected to",
                        )
                        continue
                    return await self._body(uri, response)
            except aiohttp.ClientConnectorCertificateError as e:
                raise FailedPrecondition(
                    f"audio_uri {uri}: the host's TLS certificate is not trusted ({e.certificate_error}); "
                    "its operator can add its CA to audio_uri_ca_file"
                ) from None
            except aiohttp.ClientError as e:
                raise NotReady(
                    f"audio_uri {uri}: the host cannot be reached ({type(e).__name__}: {e}); retry later"
                ) from None
        raise InvalidRequest(f"audio_uri {uri}: more than {MAX_REDIRECTS} redirects")

    async def _body(self, uri: str, response: aiohttp.ClientResponse) -> bytes:
        limit = self._settings.max_audio_bytes
        if response.status in (404, 410):
            raise NotFound(f"audio_uri {uri}: the host has nothing there ({response.status} {response.reason})")
        if response.status >= 500:
            raise NotReady(f"audio_uri {uri}: the host answered {response.status} {response.reason}; retry later")
        if response.status != 200:
            raise InvalidRequest(f"audio_uri {uri}: the host answered {response.status} {response.reason}")
        if response.content_length is not None and response.content_length > limit:
            raise TooLarge(
                f"audio_uri {uri} is {response.content_length} bytes; the limit is {limit} (max_audio_bytes)"
            )
        chunks, size = [], 0
        async for chunk in response.content.iter_chunked(_READ_CHUNK):
            size += len(chunk)
            if size > limit:
                with contextlib.suppress(Exception):
                    response.close()
                raise TooLarge(f"audio_uri {uri} is over {limit} bytes (max_audio_bytes)")
            chunks.append(chunk)
        return b"".join(chunks)
