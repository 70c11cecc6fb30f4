"""s3rver (tests/s3rver, installed by scripts/install.sh with npm): a second real S3-compatible server.

Why a second one: moto's server accepts a presigned URL after it has expired, so "the URL stops
working after it expires" cannot be shown on it; s3rver checks X-Amz-Date + X-Amz-Expires and
answers 403 "Request has expired", as S3 does. Usage:

    with S3rver() as server:
        store = S3BlobStore(server.url + "/prefix", server.env)
"""

from __future__ import annotations

import shutil
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
from tests.helpers.s3server import aws_env, stop_process

S3RVER = Path(__file__).resolve().parents[1] / "s3rver" / "node_modules" / "s3rver" / "bin" / "s3rver.js"
START_TIMEOUT_S = 20.0


class S3rver:
    """s3rver on a free port with one bucket; `.url` is `s3://<bucket>`, `.env` the AWS_* settings
    (s3rver's fixed credentials, S3RVER / S3RVER)."""

    def __init__(self) -> None:
        self.bucket = f"lipline-{uuid.uuid4().hex[:12]}"
        self.url = f"s3://{self.bucket}"
        self.endpoint = ""
        self.env: dict[str, str] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="s3rver-")

    def __enter__(self) -> S3rver:
        node = shutil.which("node")
        if node is None or not S3RVER.exists():
            pytest.skip("s3rver is not installed (needs Node.js and npm: scripts/install.sh installs it)")
        log = Path(self._dir) / "log.txt"
        for _ in range(PORT_TRIES):  # the probed port may be taken before s3rver binds it: try another
            port = free_port()
            self.endpoint = f"http://127.0.0.1:{port}"
            with log.open("wb") as out:
                self._proc = subprocess.Popen(
                    [
                        node,
                        str(S3RVER),
                        "-d",
                        f"{self._dir}/data",
                        "-a",
                        "127.0.0.1",
                        "-p",
                        str(port),
                        "--configure-bucket",
                        self.bucket,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            if self._wait_until_up():
                break
            self._stop()
        else:
            raise RuntimeError(f"s3rver did not start: {log.read_text(errors='replace')[-2000:]}")
        self.env = aws_env(self.endpoint, "S3RVER", "S3RVER")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _wait_until_up(self) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.endpoint}/{self.bucket}", timeout=2):
                    return True
            except urllib.error.HTTPError:
                return True  # it answers (an unsigned request may be refused): it is up
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.05)
        return False

    def _stop(self) -> None:
        stop_process(self._proc)
        self._proc = None
