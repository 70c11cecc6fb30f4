"""Start the four lipline services as real processes on 127.0.0.1 and stop them with SIGTERM.

Used by the demo (`python -m services.local`) and the integration tests: the same processes, the
same flags and the same health checks as in a pod, just on one machine. Ports are picked by the OS
(port 0) and read back from each service's --port-file once it reports SERVING.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

STAGES = ("audio", "lipsync", "superres")
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen
    log_path: Path
    port: int = 0
    metrics_port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class LocalCluster:
    """Context manager: `with LocalCluster(workdir) as c: LiplineClient(c.gateway_address)`."""

    workdir: Path
    output_dir: Path | None = None
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = 120.0
    processes: dict[str, ServiceProcess] = field(default_factory=dict)

    @property
    def gateway_address(self) -> str:
        return self.processes["gateway"].address

    def __enter__(self) -> LocalCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for stage in STAGES:
                self._start(stage, self.extra_args.get(stage, []))
            for stage in STAGES:
                self._wait_ready(stage)
            gateway_args = [
                f"--{stage}-address={self.processes[stage].address}" for stage in STAGES
            ] + [
                f"--data-dir={self.workdir / 'var'}",
                f"--output-dir={self.output_dir or self.workdir / 'outputs'}",
                *self.extra_args.get("gateway", []),
            ]
            self._start("gateway", gateway_args)
            self._wait_ready("gateway")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start(self, name: str, args: list[str]) -> None:
        port_file = self.workdir / f"{name}.port"
        port_file.unlink(missing_ok=True)
        log_path = self.workdir / f"{name}.log"
        cmd = [
            sys.executable, "-m", f"services.{name}", "--host=127.0.0.1", "--port=0", "--metrics-port=0",
            f"--port-file={port_file}", "--log-format=json", "--grace-s=10", *args,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
        with log_path.open("wb") as log:
            process = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.processes[name] = ServiceProcess(name, process, log_path)

    def _wait_ready(self, name: str) -> None:
        proc = self.processes[name]
        port_file = self.workdir / f"{name}.port"
        deadline = time.monotonic() + self.start_timeout_s
        while not port_file.exists():
            if proc.process.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.process.returncode} during start-up:\n{proc.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not SERVING after {self.start_timeout_s} s:\n{proc.log()[-4000:]}")
            time.sleep(0.05)
        proc.port, proc.metrics_port = (int(x) for x in port_file.read_text().split())

    def terminate(self, name: str, timeout: float = 30.0) -> int:
        """SIGTERM one service and wait for it to exit; returns its exit code."""
        proc = self.processes[name].process
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stop(self) -> None:
        for name in ["gateway", *STAGES]:
            if name in self.processes:
                self.terminate(name)


def temp_workdir(prefix: str = "lipline-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
