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
    #: replicas per stage (default 1). Replica 0 is named after the stage, the others "<stage>-<i>";
    #: the gateway gets all of a stage's addresses and balances calls over them (round-robin).
    replicas: dict[str, int] = field(default_factory=dict)
    #: GPUs to spread the GPU stages' replicas over (CUDA_VISIBLE_DEVICES, replica i -> gpus[i % n]).
    gpus: list[str] = field(default_factory=list)
    processes: dict[str, ServiceProcess] = field(default_factory=dict)

    @property
    def outputs_dir(self) -> Path:
        """Where the gateway writes finished MP4s."""
        return self.output_dir or self.workdir / "outputs"

    @property
    def gateway_address(self) -> str:
        return self.processes["gateway"].address

    def __enter__(self) -> LocalCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for stage in STAGES:
                for name in self.replica_names(stage):
                    self._start(name, self.extra_args.get(stage, []), stage)
            for stage in STAGES:
                for name in self.replica_names(stage):
                    self._wait_ready(name)
            gateway_args = [
                f"--{stage}-address={','.join(self.processes[n].address for n in self.replica_names(stage))}"
                for stage in STAGES
            ] + [
                f"--data-dir={self.workdir / 'var'}",
                f"--output-dir={self.outputs_dir}",
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

    def replica_names(self, stage: str) -> list[str]:
        return [stage if i == 0 else f"{stage}-{i}" for i in range(self.replicas.get(stage, 1))]

    def _start(self, name: str, args: list[str], module: str | None = None) -> None:
        port_file = self.workdir / f"{name}.port"
        port_file.unlink(missing_ok=True)
        log_path = self.workdir / f"{name}.log"
        cmd = [
            sys.executable, "-m", f"services.{module or name}", "--host=127.0.0.1", "--port=0", "--metrics-port=0",
            f"--port-file={port_file}", "--log-format=json", "--grace-s=10", *args,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
        if self.gpus and module in ("lipsync", "superres"):
            replica = self.replica_names(module).index(name)
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[replica % len(self.gpus)]
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
        for name in ["gateway", *(n for stage in STAGES for n in self.replica_names(stage))]:
            if name in self.processes:
                self.terminate(name)
