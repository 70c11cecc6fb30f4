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

The URI, and every redirect's target, is parsed once by services.gateway.urls (its rules refuse a
URL that two parsers could read differently: a backslash, a control character, user:pass@, ...);
`check` looks at that parsed URL, without I/O, and `fetch` sends exactly it (a `CheckedUrl`).

Each refusal names what to change: INVALID_ARGUMENT (the URL's form, scheme, bucket, host, a redirect), NOT_FOUND
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
import yarl

from services.gateway.settings import GatewaySettings
from services.gateway.urls import CheckedUrl, allowed_hosts, check_host, parse_url, resolve_redirect
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
_READ_CHUNK = 64 * 1024
_SCHEMES = ("s3", "https")
_USE = "use s3://<bucket>/<key> (the blob store's bucket) or https://<allowed host>/<path>"


class AudioFetcher:
    """Checks and fetches audio_uri for SubmitJob; one per gateway (it holds an HTTP session and an S3 reader)."""

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

    def check(self, uri: str) -> CheckedUrl:
        """`uri` parsed (services.gateway.urls) and allowed: the scheme, the bucket and key, or the
        host; InvalidRequest naming what to change. No I/O: SubmitJob checks before anything costs."""
        url = parse_url(uri, "audio_uri", _SCHEMES, _USE)
        if url.scheme == "s3":
            self._s3_key(url)
        else:
            self._check_https(url, "audio_uri")
        return CheckedUrl(url)

    async def fetch(self, source: CheckedUrl) -> bytes:
        """The bytes at a URI `check` accepted (see the module's doc for each refusal)."""
        timeout = self._settings.audio_uri_timeout_s
        try:
            async with asyncio.timeout(timeout):
                if source.url.scheme == "s3":
                    return await self._fetch_s3(source)
                return await self._fetch_https(source)
        except TimeoutError:
            raise TimedOut(
                f"fetching audio_uri {source} took longer than {timeout:g} s (audio_uri_timeout_s); "
                "make it faster to serve or send the bytes"
            ) from None

    # -- S3 ---------------------------------------------------------------------------------------

    def _s3_key(self, url: yarl.URL) -> tuple[str, str]:
        """(bucket, key) of an s3:// URL in the blob store's bucket; InvalidRequest otherwise."""
        store_url = self._blobs.url
        if not store_url.startswith("s3://"):
            raise InvalidRequest(
                f"audio_uri {url}: this gateway's blob store is not on S3, so it reads no s3:// URIs; send the bytes or an https:// URI"
            )
        bucket = yarl.URL(store_url).raw_host or ""
        if url.host != bucket or url.explicit_port is not None:
            raise InvalidRequest(
                f"audio_uri {url}: bucket {url.raw_authority!r} is not the blob store's bucket {bucket!r}, the only one this gateway reads"
            )
        if url.raw_query_string:
            raise InvalidRequest(f"audio_uri {url}: an s3:// URI has no query (?...); percent-encode a '?' in the key")
        try:
            key = urllib.parse.unquote(url.raw_path.lstrip("/"), errors="strict")
            check_key(key)
        except UnicodeDecodeError:
            raise InvalidRequest(f"audio_uri {url}: the key's %XX escapes are not UTF-8") from None
        except ValueError as e:
            raise InvalidRequest(f"audio_uri {url}: {e}") from None
        return bucket, key

    async def _fetch_s3(self, source: CheckedUrl) -> bytes:
        bucket, key = self._s3_key(source.url)
        reader = self._bucket_reader(bucket)
        limit = self._settings.max_audio_bytes
        try:
            size = await asyncio.to_thread(reader.size, key)
            if size > limit:
                raise TooLarge(f"audio_uri {source} is {size} bytes; the limit is {limit} (max_audio_bytes)")
            data = await asyncio.to_thread(reader.get, key)
        except NotFound:
            raise NotFound(f"audio_uri {source}: no such object in bucket {bucket!r}") from None
        if len(data) > limit:  # replaced between the size and the read
            raise TooLarge(f"audio_uri {source} is over {limit} bytes (max_audio_bytes)")
        return data

    def _bucket_reader(self, bucket: str) -> BlobStore:
        """The blob store's bucket without its prefix (a backend's keys are its own), same credentials."""
        if self._bucket_store is None:
            from services.jobs.store import open_blob_store

            self._bucket_store = open_blob_store(f"s3://{bucket}")
        return self._bucket_store

    # -- https ------------------------------------------------------------------------------------

    def _check_https(self, url: yarl.URL, what: str) -> None:
        if url.scheme != "https":
            raise InvalidRequest(f"{what} {url}: only https:// is allowed")
        advice = "ask its operator to allow it, or send the bytes"
        if not self._hosts:
            advice = "https audio URIs are off on this gateway; send the bytes or an s3:// URI"
        check_host(url, self._hosts, what, "audio_uri_hosts", advice)

    def _redirect(self, source: CheckedUrl, location: str) -> CheckedUrl:
        """Where a redirect from `source` leads, parsed and checked like audio_uri itself."""
        what = f"audio_uri {source} redirected to"
        url = parse_url(resolve_redirect(source.url, location, what), what, ("https",), "only https:// is allowed")
        self._check_https(url, what)
        return CheckedUrl(url)

    async def _fetch_https(self, source: CheckedUrl) -> bytes:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl), trust_env=False)
        target = source
        for _ in range(MAX_REDIRECTS + 1):
            try:
                async with self._session.get(target.url, allow_redirects=False) as response:
                    if response.status in (301, 302, 303, 307, 308) and "Location" in response.headers:
                        target = self._redirect(target, response.headers["Location"])
                        continue
                    return await self._body(source, response)
            except aiohttp.ClientConnectorCertificateError as e:
                raise FailedPrecondition(
                    f"audio_uri {source}: the host's TLS certificate is not trusted ({e.certificate_error}); "
                    "its operator can add its CA to audio_uri_ca_file"
                ) from None
            except aiohttp.ClientError as e:
                raise NotReady(
                    f"audio_uri {source}: the host cannot be reached ({type(e).__name__}: {e}); retry later"
                ) from None
        raise InvalidRequest(f"audio_uri {source}: more than {MAX_REDIRECTS} redirects")

    async def _body(self, source: CheckedUrl, response: aiohttp.ClientResponse) -> bytes:
        uri = str(source)
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
