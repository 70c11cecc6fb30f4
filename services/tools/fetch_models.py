"""`python -m services.tools.fetch_models`: put model checkpoints on the models volume, checked by sha256.

The chart's models-download Job (values `models.download`) runs it in the gateway image, before the
stages start or roll:

    python -m services.tools.fetch_models --dest /models \\
        --item wav2lip.pth https://example.org/wav2lip.pth <sha256> \\
        --item realesr-general-x4v3.pth s3://weights/realesr-general-x4v3.pth <sha256>

Each item comes from http(s):// (urllib; redirects followed) or s3://bucket/key (obstore, through the
blob store's S3 client, so the same AWS_* variables: credentials, AWS_REGION, AWS_ENDPOINT_URL for an
S3-compatible server). It is streamed into a temporary file next to its destination while its sha256
is computed, and renamed over the destination only when the hash matches: a stage pod reading the
volume sees the old file, the new one or none, never a partial one. A file already present with the
right hash is left alone (no request), so running again is cheap; one with another hash is replaced.
Transient failures (connection errors, timeouts, HTTP 5xx/408/429, S3 unreachable) are retried with
back-off; a 404 or a denied request is not.

`--require PATH` (repeatable; the chart passes the paths an enabled stage's config names, e.g. the
256 px tier's `musetalkV15/unet.pth`, `sd-vae`, `whisper`) checks, after the downloads, that the
volume holds what the stages will load: a file, or a Hugging Face model folder (its `config.json`
and a `*.safetensors` or `*.bin` weights file). A missing one fails the Job naming it, rather than the
stage's pods failing their start-up one by one later.

Exit codes: 0 every file is present with its hash; 1 a download failed (network, HTTP status, S3
error, the volume not writable); 2 bad arguments; 3 a download's sha256 is not the expected one (a
wrong URL or a wrong hash in the values); 4 every download worked but a `--require`d path is not on
the volume. Every item is tried before exiting; the worst failure decides the code (3 over 1, either
over 4). Standard library only, and obstore for s3:// items; no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

_LOGGER = logging.getLogger("lipline.fetch_models")

EXIT_OK = 0
EXIT_FETCH_FAILED = 1
EXIT_USAGE = 2
EXIT_HASH_MISMATCH = 3
EXIT_MISSING = 4

CHUNK_BYTES = 1024 * 1024
SCHEMES = ("http", "https", "s3")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_USER_AGENT = "lipline-fetch-models"
# HTTP statuses worth another attempt: the server's trouble, not the request's.
_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})

Opener = Callable[[str, float], Iterator[bytes]]


class FetchError(Exception):
    """A download that failed; `retry` when another attempt may succeed."""

    def __init__(self, message: str, *, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


class HashMismatch(Exception):
    """What was downloaded is not what the item's sha256 says."""


def display_url(url: str) -> str:
    """The URL for logs: no query string (a presigned URL carries its signature there) and no user:password."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "…" if parts.query else "", ""))


def check_relative_name(name: str, what: str) -> None:
    """A path under --dest that stays under it (an item's name, a --require); ValueError naming `what`."""
    segments = name.split("/")
    if not name or name.startswith("/") or "\\" in name or "\0" in name:
        raise ValueError(f"{what} {name!r}: expected a relative path such as wav2lip.pth")
    if any(s in ("", ".", "..") for s in segments) or segments[-1].startswith("."):
        raise ValueError(f"{what} {name!r}: no empty, '.' or '..' segments and no hidden file name")


@dataclasses.dataclass(frozen=True)
class Item:
    """One checkpoint: `name` (a relative path under --dest), where it comes from, its sha256 (hex)."""

    name: str
    url: str
    sha256: str

    @classmethod
    def parse(cls, name: str, url: str, sha256: str) -> Item:
        """Checked and normalised; raises ValueError with what is wrong."""
        check_relative_name(name, "item name")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in SCHEMES:
            raise ValueError(f"item {name}: url {display_url(url)!r} is not http://, https:// or s3://")
        if not parts.netloc or (parts.scheme == "s3" and not parts.path.strip("/")):
            raise ValueError(
                f"item {name}: url {display_url(url)!r} needs a host (s3://bucket/key: a bucket and a key)"
            )
        digest = sha256.strip().lower()
        if not _SHA256.match(digest):
            raise ValueError(f"item {name}: sha256 {sha256!r} is not 64 hex digits")
        return cls(name, url, digest)


def parse_items(raw: Sequence[Sequence[str]]) -> list[Item]:
    items = [Item.parse(*triple) for triple in raw]
    names = [i.name for i in items]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"item names appear twice: {dupes}")
    return items


def missing_required(dest: Path, paths: Sequence[str]) -> list[str]:
    """What each of `paths` (relative to `dest`) lacks, one line each; empty when all are there. A path
    must be a non-empty file, or a Hugging Face model folder: `config.json` and a weights file
    (`*.safetensors` or `*.bin`, the names differ by library: diffusers, transformers)."""
    problems = []
    for name in paths:
        path = dest / name
        if path.is_file():
            if path.stat().st_size == 0:
                problems.append(f"{name}: the file is empty")
        elif path.is_dir():
            lacks = [] if (path / "config.json").is_file() else ["config.json"]
            if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
                lacks.append("a *.safetensors or *.bin weights file")
            if lacks:
                problems.append(f"{name}/: a model folder without {' or '.join(lacks)}")
        else:
            problems.append(f"{name}: not on the volume (add it to models.download.items, or copy it there)")
    return problems


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(CHUNK_BYTES):
            digest.update(piece)
    return digest.hexdigest()


def _http_chunks(url: str, timeout: float) -> Iterator[bytes]:
    shown = display_url(url)
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise FetchError(f"{shown}: HTTP {exc.code} {exc.reason}", retry=exc.code in _RETRY_STATUS) from None
    except (urllib.error.URLError, OSError) as exc:  # refused, DNS, TLS, timeouts
        raise FetchError(f"{shown}: {getattr(exc, 'reason', exc)}", retry=True) from None
    with response:
        length = response.headers.get("Content-Length")
        received = 0
        while True:
            try:
                piece = response.read(CHUNK_BYTES)
            except OSError as exc:
                raise FetchError(f"{shown}: read failed after {received} bytes: {exc}", retry=True) from None
            if not piece:
                break
            received += len(piece)
            yield piece
    if length is not None and length.isdigit() and received != int(length):
        raise FetchError(f"{shown}: the connection ended after {received} of {length} bytes", retry=True)


def _s3_chunks(url: str, timeout: float) -> Iterator[bytes]:
    # Imported here: http(s)-only runs never load obstore. The blob store's client reads the AWS_* variables.
    from services.jobs.store.s3 import S3BlobStore
    from services.serving.errors import NotFound, StoreUnavailable

    parts = urllib.parse.urlsplit(url)
    key = parts.path.lstrip("/")
    try:
        store = S3BlobStore(f"s3://{parts.netloc}", client_options={"read_timeout": f"{max(1, int(timeout))}s"})
        try:
            yield from store.read_chunks(key, CHUNK_BYTES)
        finally:
            store.close()
    except NotFound:
        raise FetchError(f"{url}: no such object (check the bucket, the key and AWS_ENDPOINT_URL)") from None
    except StoreUnavailable as exc:
        raise FetchError(f"{url}: S3 unreachable: {exc}", retry=True) from None
    except Exception as exc:  # noqa: BLE001 - obstore's own errors (denied credentials, bad key): not retried
        raise FetchError(f"{url}: {type(exc).__name__}: {exc}") from None


def open_source(url: str, timeout: float) -> Iterator[bytes]:
    """The object at `url` as a stream of chunks; FetchError on failure (before or during the stream)."""
    scheme = urllib.parse.urlsplit(url).scheme
    return _s3_chunks(url, timeout) if scheme == "s3" else _http_chunks(url, timeout)


def _download(item: Item, final: Path, opener: Opener, timeout: float) -> int:
    """Stream `item` into a temporary file beside `final`, check its hash, rename it over `final`; the size."""
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
    digest = hashlib.sha256()
    size = 0
    try:
        with open(tmp, "xb") as f:
            for piece in opener(item.url, timeout):
                f.write(piece)
                digest.update(piece)
                size += len(piece)
            f.flush()
            os.fsync(f.fileno())
        got = digest.hexdigest()
        if got != item.sha256:
            raise HashMismatch(
                f"{item.name}: {display_url(item.url)} has sha256 {got} ({size} bytes), expected {item.sha256}: check the URL and the item's sha256"
            )
        os.chmod(tmp, 0o644)  # readable by every pod, whatever its uid
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # the rename itself survives a node crash
        fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return size


def fetch_item(
    item: Item,
    dest: Path,
    *,
    opener: Opener = open_source,
    retries: int = 3,
    timeout: float = 60.0,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Make `dest/item.name` hold the item: "present" (already had the hash) or "downloaded".

    Raises:
        FetchError: the download failed (after `retries` more attempts when the failure was transient).
        HashMismatch: the download's sha256 is not the item's; nothing is left at the destination
            (a file already there is kept).
        OSError: the destination cannot be written.
    """
    final = dest / item.name
    if final.is_file():
        have = file_sha256(final)
        if have == item.sha256:
            _LOGGER.info("%s: present, sha256 matches", item.name)
            return "present"
        _LOGGER.warning("%s: present with sha256 %s, expected %s: downloading it again", item.name, have, item.sha256)
    final.parent.mkdir(parents=True, exist_ok=True)
    attempts = retries + 1
    for attempt in range(1, attempts + 1):
        start = time.monotonic()
        try:
            size = _download(item, final, opener, timeout)
        except FetchError as exc:
            if not exc.retry or attempt == attempts:
                raise
            wait = min(2.0**attempt, 30.0)
            _LOGGER.warning("%s: attempt %d/%d failed (%s); again in %.0f s", item.name, attempt, attempts, exc, wait)
            sleep(wait)
            continue
        took = time.monotonic() - start
        _LOGGER.info(
            "%s: downloaded %d bytes from %s in %.1f s, sha256 matches", item.name, size, display_url(item.url), took
        )
        return "downloaded"
    raise AssertionError("unreachable")


def main(
    argv: Sequence[str] | None = None, *, opener: Opener = open_source, sleep: Callable[[float], None] = time.sleep
) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.tools.fetch_models",
        description="Download model checkpoints from http(s):// or s3:// into a folder, each checked against its sha256.",
    )
    parser.add_argument("--dest", type=Path, required=True, help="the folder (the models volume's mount path)")
    parser.add_argument(
        "--item",
        nargs=3,
        action="append",
        required=True,
        metavar=("NAME", "URL", "SHA256"),
        help="one checkpoint: its file name under --dest, http(s):// or s3://bucket/key, its sha256; repeat",
    )
    parser.add_argument(
        "--require",
        action="append",
        default=[],
        metavar="PATH",
        help="a file or model folder under --dest the stages will load: checked after the downloads; repeat",
    )
    parser.add_argument("--retries", type=int, default=3, help="more attempts after a transient failure (default 3)")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds a connection or a read may wait (default 60)"
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        items = parse_items(args.item)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        for name in args.require:
            check_relative_name(name, "--require")
    except ValueError as exc:
        parser.error(str(exc))
    if args.retries < 0 or args.timeout <= 0:
        parser.error("--retries must be >= 0 and --timeout > 0")
    dest: Path = args.dest
    if not dest.is_dir():
        _LOGGER.error("--dest %s is not a directory: is the models volume mounted there?", dest)
        return EXIT_USAGE
    if not os.access(dest, os.W_OK | os.X_OK):
        _LOGGER.error(
            "%s is not writable by uid %d (gid %d): give the volume to that user or group (the chart's podSecurityContext.fsGroup), or mount it read-write",
            dest,
            os.getuid(),
            os.getgid(),
        )
        return EXIT_FETCH_FAILED

    worst = EXIT_OK
    outcomes: dict[str, int] = {"present": 0, "downloaded": 0, "failed": 0}
    for item in items:
        try:
            outcomes[
                fetch_item(item, dest, opener=opener, retries=args.retries, timeout=args.timeout, sleep=sleep)
            ] += 1
            continue
        except HashMismatch as exc:
            _LOGGER.error("%s", exc)
            worst = max(worst, EXIT_HASH_MISMATCH)
        except FetchError as exc:
            _LOGGER.error("%s: download failed: %s", item.name, exc)
            worst = max(worst, EXIT_FETCH_FAILED)
        except OSError as exc:
            _LOGGER.error("%s: cannot write under %s: %s", item.name, dest, exc)
            worst = max(worst, EXIT_FETCH_FAILED)
        outcomes["failed"] += 1
    _LOGGER.info(
        "models in %s: %d present, %d downloaded, %d failed",
        dest,
        outcomes["present"],
        outcomes["downloaded"],
        outcomes["failed"],
    )
    missing = missing_required(dest, args.require)
    for problem in missing:
        _LOGGER.error("required by a stage: %s", problem)
    if missing and worst == EXIT_OK:
        return EXIT_MISSING
    return worst


if __name__ == "__main__":
    sys.exit(main())
