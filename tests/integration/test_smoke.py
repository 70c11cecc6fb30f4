"""The chart's `helm test` command (`python -m services.gateway.smoke`) against the real services.

Run as a subprocess, exactly as the test pod runs it: it must pass against a healthy gateway, fail
with a readable reason (and exit 1, no traceback) against an address with nothing behind it, and
leave the gateway's avatars as it found them.
"""

from __future__ import annotations

import socket
import subprocess
import sys

from services.gateway.client import LiplineClient
from services.local.cluster import REPO_ROOT, LocalCluster


def _smoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.gateway.smoke", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_smoke_check_passes_against_the_running_gateway(cluster: LocalCluster, client: LiplineClient) -> None:
    before = {a.id for a in client.list_avatars()}
    result = _smoke(f"--address={cluster.gateway_address}", "--timeout=120")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "smoke: ok" in result.stdout
    assert {a.id for a in client.list_avatars()} == before  # its own avatar deleted again, anyone else's kept


def test_smoke_check_explains_an_unreachable_gateway() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        result = _smoke(f"--address=127.0.0.1:{port}", "--timeout=5")
    assert result.returncode == 1
    assert "UNAVAILABLE" in result.stderr and "Traceback" not in result.stderr
