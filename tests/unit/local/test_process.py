"""services.local.process: how local mode waits for, stops and reports on the processes it starts."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from services.local.cluster import LocalCluster
from services.local.process import ServiceProcess


def _process(tmp_path: Path, script: str) -> ServiceProcess:
    port_file, log_path = tmp_path / "svc.port", tmp_path / "svc.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen([sys.executable, "-c", script, str(port_file)], stdout=log, stderr=subprocess.STDOUT)
    return ServiceProcess("svc", popen, log_path, "audio", port_file=port_file)


def test_ready_once_the_port_file_names_the_ports(tmp_path: Path) -> None:
    svc = _process(tmp_path, "import sys, time; open(sys.argv[1], 'w').write('4321 4322'); time.sleep(60)")
    try:
        svc.wait_ready(timeout=20)
        assert (svc.port, svc.metrics_port, svc.address) == (4321, 4322, "127.0.0.1:4321")
    finally:
        assert svc.terminate(timeout=10) == -signal.SIGTERM


def test_a_port_file_created_before_it_is_written_is_not_yet_ready(tmp_path: Path) -> None:
    """A writer that opens the file, then writes (no rename into place): wait_ready waits for the ports."""
    script = (
        "import sys, time; f = open(sys.argv[1], 'w'); f.flush(); time.sleep(0.5); "
        "f.write('4321 4322'); f.close(); time.sleep(60)"
    )
    svc = _process(tmp_path, script)
    try:
        svc.wait_ready(timeout=20)
        assert (svc.port, svc.metrics_port) == (4321, 4322)
    finally:
        svc.terminate(timeout=10)


def test_a_process_that_dies_during_start_up_says_so_with_its_log(tmp_path: Path) -> None:
    svc = _process(tmp_path, "import sys; print('bad flag --x'); sys.exit(3)")
    with pytest.raises(RuntimeError, match=r"(?s)svc exited with 3 during start-up:.*bad flag --x"):
        svc.wait_ready(timeout=20)


def test_a_process_that_never_serves_times_out_and_is_killed_after_sigterm_is_ignored(tmp_path: Path) -> None:
    ignore_term = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    svc = _process(tmp_path, ignore_term)
    with pytest.raises(TimeoutError, match="svc not SERVING after 1 s"):
        svc.wait_ready(timeout=1)
    assert svc.terminate(timeout=1) == -signal.SIGKILL


def test_replica_names_and_the_flags_a_stage_gets(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, job_store="sqlite:///j.db", replicas={"lipsync": 3})
    assert cluster.replica_names("lipsync") == ["lipsync", "lipsync-1", "lipsync-2"]
    assert cluster.replica_names("audio") == ["audio"]
    assert cluster.replica_names("render") == ["render", "render-1"]
    assert cluster.replica_names("live") == []  # live workers only when asked for
    assert LocalCluster(tmp_path, replicas={"live": 1}).replica_names("live") == ["live"]
    assert cluster.service_of("lipsync-2") == "lipsync"
    assert cluster.store_args("audio") == []  # no stores, calls nobody


def test_a_restart_waits_for_its_port_while_another_socket_holds_it(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, replicas={"live": 0})
    cluster.start_service("audio", wait=True)
    try:
        port = cluster.processes["audio"].port
        cluster.kill("audio")
        holder = socket.socket()  # what a client's outgoing connection can do between the kill and the bind
        holder.bind(("127.0.0.1", port))
        holder.listen()

        def release_once_refused() -> None:  # the port comes free only after a start failed to bind it
            deadline = time.monotonic() + 120
            while "Address already in use" not in cluster.processes["audio"].log() and time.monotonic() < deadline:
                time.sleep(0.05)
            holder.close()

        threading.Thread(target=release_once_refused, daemon=True).start()
        cluster.restart("audio")
        assert cluster.processes["audio"].port == port
    finally:
        cluster.stop()
