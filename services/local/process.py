"""One lipline service as a child process: start it, wait for SERVING, stop it with SIGTERM.

The local cluster (services/local/cluster.py) and the gRPC benchmarks (bench/) start their services
through `start`: `python -m services.<stage>` with the caller's flags plus `--port-file`, stdout and
stderr into a log file. The service writes "<port> <metrics port>" to the port file once it reports
SERVING (port 0 = the OS picks one), which `wait_ready` reads back; a service with an HTTP port
(the web page) writes it third.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from services.local.affinity import pin_process
from services.serving.stages import stage as registered

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ServiceProcess:
    """A started service. `args` are its flags as given (a restart passes them again)."""

    name: str
    process: subprocess.Popen
    log_path: Path
    #: the stage it runs (`python -m services.<module>`)
    module: str = ""
    args: list[str] = field(default_factory=list)
    port: int = 0
    metrics_port: int = 0
    #: the HTTP port of a service that has one (the web page); 0 otherwise
    http_port: int = 0
    port_file: Path = Path()
    cmd: list[str] = field(default_factory=list)
    started: float = 0.0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The HTTP server's address (the web page), once SERVING."""
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 4000) -> str:
        return self.log()[-chars:]

    def wait_ready(self, timeout: float) -> float:
        """Wait for the port file (SERVING); set port, metrics_port (and http_port); seconds since the start.

        Raises RuntimeError when the process exits first, TimeoutError after `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        while len(ports := self._written_ports()) < 2:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode} during start-up:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not SERVING after {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.05)
        self.port, self.metrics_port = ports[:2]
        self.http_port = ports[2] if len(ports) > 2 else 0
        return time.monotonic() - self.started

    def _written_ports(self) -> list[int]:
        """The ports in the port file so far; [] while it is absent, and while a writer that does not
        rename into place (the serving bootstrap does) has created it but not yet written it."""
        try:
            return [int(x) for x in self.port_file.read_text().split()]
        except (FileNotFoundError, ValueError):
            return []

    def signal_stop(self) -> None:
        """SIGTERM, if it still runs: the service goes NOT_SERVING and drains within its grace_s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; SIGKILL after `timeout`. The exit code."""
        self.signal_stop()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL (no drain) and reap."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def start(
    name: str,
    module: str,
    args: Sequence[str],
    workdir: Path,
    *,
    base_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cuda_visible_devices: str | None = None,
    cpus: Collection[int] | None = None,
) -> ServiceProcess:
    """Start `python -m services.<module> <base_args> <args> --port-file=<workdir>/<name>.port`, logging to
    <workdir>/<name>.log.

    Args:
        name: the process's name (a replica: "<stage>-<i>"); names its port and log files.
        module: the stage it runs (a name in services.serving.stages).
        args: its own flags (kept in ServiceProcess.args); the port file is added.
        base_args: the caller's flags of every service it starts (host, ports, logs), before `args`.
        env: variables set over this process's environment (PYTHONPATH gets the repository first).
        cuda_visible_devices: the GPUs it sees, if given.
        cpus: the cores it (and every thread and child it starts) may run on, if given
            (services/local/affinity.py); otherwise it inherits this process's.
    """
    port_file = workdir / f"{name}.port"
    port_file.unlink(missing_ok=True)
    log_path = workdir / f"{name}.log"
    cmd = [sys.executable, "-m", registered(module).module, *base_args, *args, f"--port-file={port_file}"]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full_env.get("PYTHONPATH", "")]))
    if cuda_visible_devices is not None:
        full_env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, cwd=REPO_ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    if cpus is not None:
        pin_process(process.pid, cpus)
    return ServiceProcess(name, process, log_path, module, list(args), port_file=port_file, cmd=cmd, started=started)
