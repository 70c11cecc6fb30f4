"""A real S3-compatible server for tests: moto's standalone server, from .venv-s3server/.

scripts/install.sh installs it (requirements-s3server.lock) into its own virtual environment, because
moto's botocore cannot share the main one. Usage:

    with S3Server() as server:          # skips the test when .venv-s3server is missing
        store = S3BlobStore(server.url + "/some/prefix", server.env)

The server listens on 127.0.0.1 on a free port, keeps everything in memory and is stopped at exit.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType

import pytest

from tests.helpers.ports import PORT_TRIES, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
MOTO_SERVER = REPO_ROOT / ".venv-s3server" / "bin" / "moto_server"
START_TIMEOUT_S = 30.0


def moto_server_binary() -> Path:
    """The moto_server that scripts/install.sh installs; skip the calling test without it."""
    if not os.access(MOTO_SERVER, os.X_OK):
        pytest.skip(f"needs the S3 test server {MOTO_SERVER.relative_to(REPO_ROOT)} (run `bash scripts/install.sh`)")
    return MOTO_SERVER


def aws_env(endpoint: str, access_key: str, secret_key: str) -> dict[str, str]:
    """The AWS_* settings that point a blob store (services/jobs/store/s3.py) at a local S3 server."""
    return {
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
    }


def stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM a test server, SIGKILL it after 5 s, and reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class S3Server:
    """moto_server on a free port with one bucket; `.url` is `s3://<bucket>`, `.env` the AWS_* settings.

    `.url` has no prefix: give each test its own (`f"{server.url}/{uuid}"`) to keep tests apart.
    """

    def __init__(self, bucket: str | None = None) -> None:
        self.bucket = bucket or f"lipline-test-{uuid.uuid4().hex[:12]}"
        self.port = 0
        self.endpoint = ""
        self.url = f"s3://{self.bucket}"
        self.env: dict[str, str] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: tempfile._TemporaryFileWrapper[bytes] | None = None

    def __enter__(self) -> S3Server:
        binary = moto_server_binary()
        last_error = ""
        for _ in range(PORT_TRIES):  # the free port can be taken between probing and binding it; try another
            self.port = free_port()
            self.endpoint = f"http://127.0.0.1:{self.port}"
            self._log = tempfile.NamedTemporaryFile(prefix="moto-server-", suffix=".log")
            self._proc = subprocess.Popen(
                [str(binary), "-H", "127.0.0.1", "-p", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            try:
                self._wait_until_up()
                break
            except RuntimeError as e:
                last_error = str(e)
                self._stop()
        else:
            raise RuntimeError(f"moto_server did not start: {last_error}")
        # Plain HTTP: moto accepts unsigned requests, so the bucket does not depend on the code under test.
        self._request("PUT", f"/{self.bucket}")
        self.env = aws_env(self.endpoint, "testing", "testing")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()

    def _request(self, method: str, path: str) -> int:
        req = urllib.request.Request(self.endpoint + path, method=method)
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status

    def _wait_until_up(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self._proc.returncode}: {self._log_tail()}")
            try:
                self._request("GET", "/")  # ListBuckets
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.05)
        raise RuntimeError(f"moto_server did not answer within {START_TIMEOUT_S:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        return Path(self._log.name).read_bytes()[-2000:].decode(errors="replace")

    def _stop(self) -> None:
        stop_process(self._proc)
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
