"""The blob store on S3 or an S3-compatible server (MinIO, Ceph, moto in the tests), through obstore.

`S3BlobStore("s3://bucket/optional/prefix")`: every key lives under the prefix. Configuration comes
from the standard AWS environment variables:

- AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN: credentials (without them obstore
  falls back to the usual providers: web identity / IRSA, ECS, instance metadata);
- AWS_REGION, else AWS_DEFAULT_REGION (obstore's default: us-east-1);
- AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL: a custom endpoint (an S3-compatible server). With one,
  requests are path-style (`<endpoint>/<bucket>/<key>`; virtual-hosted style would need the bucket in
  the endpoint), unless AWS_VIRTUAL_HOSTED_STYLE_REQUEST says otherwise; an `http://` endpoint (or
  AWS_ALLOW_HTTP=true) allows plain HTTP.

S3's PUT (and a multipart upload's completion) is atomic: a reader sees the old object, the new one
or none. Files go up as streamed multipart uploads and come down as streams, never whole in memory.

Errors: a missing key raises NotFound; a server that cannot be reached (connection refused, timeouts,
5xx after obstore's retries) or a missing bucket raises StoreUnavailable; anything else (e.g. denied
credentials) is raised as obstore's own exception; a server out of room or quota (507, QuotaExceeded)
raises StorageFull. obstore retries connection errors and 5xx itself, with exponential backoff, for
at most `retry_timeout` (5 s here; obstore's default is 3 min): callers hear of an outage fast, and
render workers ride longer ones out with their own back-off.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import obstore
import obstore.exceptions
from obstore.store import S3Store

from services.jobs.store.blobs import BlobStore, atomic_write, check_key, check_prefix
from services.serving.errors import NotFound, StorageFull, StoreUnavailable

if TYPE_CHECKING:  # obstore's option types exist in its stubs only
    from obstore.store import ClientConfig, RetryConfig, S3Config

T = TypeVar("T")

# Defaults, overridable per store (`client_options`, `retry_config`). The overall request timeout is
# long because a download stays one request while its reader (e.g. a slow gRPC client) consumes it;
# a stalled connection is caught by the read timeout, which only runs while a read is waiting.
DEFAULT_CLIENT_OPTIONS: dict[str, Any] = {
    "connect_timeout": timedelta(seconds=5),
    "read_timeout": timedelta(seconds=120),
    "timeout": timedelta(hours=1),
}
# Short: a caller that waits a minute for an unreachable store has timed out already. Outages longer
# than this are the render workers' to ride out (they retry a task with back-off for retry_window_s).
DEFAULT_RETRY_CONFIG: dict[str, Any] = {"max_retries": 4, "retry_timeout": timedelta(seconds=5)}

_COPY_CHUNK = 1024 * 1024
_LIST_BATCH = 1000
# obstore's message (Display, then the Rust Debug of its source) for transport errors and 5xx answers.
_UNREACHABLE = re.compile(
    r"HTTP error|error sending request|status code: 5\d\d|status: 5\d\d"
    r"|kind: (?:Connect|Request|Timeout|Interrupted|Body|Decode)\b|TimedOut|timed out|Connection (?:refused|reset)"
)
# S3 and S3-compatible servers saying "no room": 507 Insufficient Storage (MinIO's XMinioStorageFull),
# quota errors of Ceph RGW (QuotaExceeded) and others.
_FULL = re.compile(r"status(?: code)?: 507|Insufficient Storage|XMinioStorageFull|QuotaExceeded|StorageFull", re.I)
_TRUE = {"1", "true", "yes", "on"}


class S3BlobStore(BlobStore):
    """Blobs as objects in an S3 bucket, under an optional key prefix.

    Args:
        url: `s3://bucket` or `s3://bucket/prefix`.
        env: where to read the AWS_* settings (see the module docstring); default `os.environ`.
            Tests pass a dict instead of changing the process environment. Note that obstore itself
            also reads AWS_* variables from the process environment for any setting not given here
            (for example AWS_SESSION_TOKEN or AWS_CONTAINER_CREDENTIALS_*), so `env` overrides the
            process environment but does not hide it.
        client_options: obstore `ClientConfig` entries merged over DEFAULT_CLIENT_OPTIONS
            (e.g. `{"connect_timeout": "1s"}`).
        retry_config: obstore `RetryConfig` entries merged over DEFAULT_RETRY_CONFIG
            (e.g. `{"max_retries": 0}`).
    """

    def __init__(
        self,
        url: str,
        env: Mapping[str, str] | None = None,
        *,
        client_options: Mapping[str, Any] | None = None,
        retry_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.bucket, self.prefix = parse_s3_url(url)
        env = os.environ if env is None else env

        def setting(*names: str) -> str | None:
            for name in names:
                value = env.get(name)
                if value:
                    return value
            return None

        config: dict[str, Any] = {}
        for key, names in (
            ("access_key_id", ("AWS_ACCESS_KEY_ID",)),
            ("secret_access_key", ("AWS_SECRET_ACCESS_KEY",)),
            ("session_token", ("AWS_SESSION_TOKEN",)),
            ("region", ("AWS_REGION", "AWS_DEFAULT_REGION")),
        ):
            if (value := setting(*names)) is not None:
                config[key] = value
        endpoint = setting("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
        if endpoint:
            config["endpoint"] = endpoint.rstrip("/")
        virtual_hosted = setting("AWS_VIRTUAL_HOSTED_STYLE_REQUEST")
        if virtual_hosted is not None:
            config["virtual_hosted_style_request"] = virtual_hosted.lower() in _TRUE
        elif endpoint:
            config["virtual_hosted_style_request"] = False

        client: dict[str, Any] = dict(DEFAULT_CLIENT_OPTIONS)
        allow_http = setting("AWS_ALLOW_HTTP")
        if (endpoint and endpoint.lower().startswith("http://")) or (allow_http and allow_http.lower() in _TRUE):
            client["allow_http"] = True
        client.update(client_options or {})
        retry: dict[str, Any] = dict(DEFAULT_RETRY_CONFIG)
        retry.update(retry_config or {})

        # The options are built key by key from settings; obstore checks them when the store opens.
        self._store = S3Store(
            self.bucket,
            prefix=self.prefix or None,
            config=cast("S3Config", config),
            client_options=cast("ClientConfig", client),
            retry_config=cast("RetryConfig", retry),
        )

    def __repr__(self) -> str:
        return f"S3BlobStore({self.url!r})"

    # -- writes -----------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        check_key(key)
        self._call(key, lambda: obstore.put(self._store, key, data), write=True)

    def put_file(self, key: str, path: Path) -> None:
        check_key(key)
        # Opened here so that a missing local file is the caller's FileNotFoundError, not a NotFound.
        # obstore reads it in parts: a multipart upload when it is larger than one part (5 MiB).
        with open(path, "rb") as f:
            self._call(key, lambda: obstore.put(self._store, key, f), write=True)

    def delete(self, key: str) -> None:
        check_key(key)
        self._call(key, lambda: obstore.delete(self._store, key), write=True)  # S3: a missing key is fine

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list(prefix)
        if keys:  # one DeleteObjects request per 1000 keys
            self._call(prefix, lambda: obstore.delete(self._store, keys), write=True)
        return len(keys)

    # -- reads ------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        check_key(key)
        return self._call(key, lambda: bytes(obstore.get(self._store, key).bytes()))

    def get_file(self, key: str, path: Path) -> None:
        check_key(key)
        path = Path(path)
        result = self._call(key, lambda: obstore.get(self._store, key))

        def fill(dst: Any) -> None:
            for piece in self._stream(key, result, _COPY_CHUNK):
                dst.write(piece)

        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, fill)

    def read_chunks(self, key: str, chunk_bytes: int) -> Iterator[bytes]:
        check_key(key)
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
        result = self._call(key, lambda: obstore.get(self._store, key))  # now: NotFound before any chunk
        return self._rechunk(key, result, chunk_bytes)

    def size(self, key: str) -> int:
        check_key(key)
        return int(self._call(key, lambda: obstore.head(self._store, key))["size"])

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except NotFound:
            return False
        return True

    def list(self, prefix: str) -> list[str]:
        return sorted(self._listed(prefix))

    def modified_times(self, prefix: str) -> dict[str, float]:
        return {key: meta["last_modified"].timestamp() for key, meta in self._listed(prefix).items()}

    def _listed(self, prefix: str) -> dict[str, Any]:
        """Each key starting with `prefix` and its listing's metadata (obstore's ObjectMeta)."""
        check_prefix(prefix)
        # obstore lists whole path segments (`jobs/12` would not match `jobs/123/x`): list the deepest
        # folder the prefix names in full and keep the keys that start with the prefix.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else None

        def collect() -> dict[str, Any]:
            listed: dict[str, Any] = {}
            for batch in obstore.list(self._store, prefix=base, chunk_size=_LIST_BATCH):
                listed.update((meta["path"], meta) for meta in batch if meta["path"].startswith(prefix))
            return listed

        return self._call(prefix, collect)

    def presigned_url(self, key: str, expires_s: float) -> str:
        """An S3 presigned GET URL (SigV4 query string) of `key`, signed with the store's credentials;
        S3 caps its life at 7 days."""
        check_key(key)
        return self._call(key, lambda: obstore.sign(self._store, "GET", key, timedelta(seconds=expires_s)))

    # -- helpers ----------------------------------------------------------------------------------

    def _rechunk(self, key: str, result: Any, chunk_bytes: int) -> Iterator[bytes]:
        """obstore's stream yields pieces of any size; hand out pieces of exactly chunk_bytes (the last
        one may be shorter)."""
        pending = bytearray()
        for piece in self._stream(key, result, min(chunk_bytes, _COPY_CHUNK)):
            if not pending and len(piece) == chunk_bytes:
                yield piece
                continue
            pending += piece
            while len(pending) >= chunk_bytes:
                yield bytes(pending[:chunk_bytes])
                del pending[:chunk_bytes]
        if pending:
            yield bytes(pending)

    def _stream(self, key: str, result: Any, min_chunk: int) -> Iterator[bytes]:
        stream = result.stream(min_chunk_size=min_chunk)
        while True:
            try:
                buf = next(stream)
            except StopIteration:
                return
            except Exception as e:
                raise self._map_error(e, key) from e
            yield buf

    def _call(self, key: str, fn: Callable[[], T], *, write: bool = False) -> T:
        try:
            return fn()
        except Exception as e:
            mapped = self._map_error(e, key, write=write)
            if mapped is e:
                raise
            raise mapped from e

    def _map_error(self, e: Exception, key: str, *, write: bool = False) -> Exception:
        message = str(e)
        if isinstance(e, FileNotFoundError):
            if "NoSuchBucket" in message or write:
                return StoreUnavailable(f"S3 blob store {self.url}: bucket {self.bucket!r} not found")
            return NotFound(f"blob not found: {key}")
        if isinstance(e, obstore.exceptions.BaseError) and _FULL.search(message):
            return StorageFull(
                f"the S3 blob store {self.url} is full (a quota or no space left); free space or raise the quota, then retry"
            )
        if isinstance(e, obstore.exceptions.BaseError) and _UNREACHABLE.search(message):
            first_line = message.split("\n", 1)[0][:300]
            return StoreUnavailable(
                f"the S3 blob store {self.url} cannot be reached ({first_line}); check the endpoint and the network, then retry"
            )
        return e


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/optional/prefix` -> (bucket, "optional/prefix") (prefix "" when none)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError(f"blob store url {url!r}: expected s3://bucket/optional/prefix")
    if parts.query or parts.fragment:
        raise ValueError(f"blob store url {url!r}: no query or fragment allowed")
    prefix = parts.path.strip("/")
    if prefix:
        check_key(prefix)  # the same rules as keys: no empty, '.' or '..' segments
    return parts.netloc, prefix
