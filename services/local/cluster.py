"""Start lipline's services as real processes on 127.0.0.1 and stop them with SIGTERM.

Used by the demo (`python -m services.local`) and the integration tests: the same processes, the
same flags and the same health checks as in a pod, just on one machine: the three stages, one or
more gateways and two or more render workers, sharing the embedded stores (an SQLite file and a
local folder) or the ones given (a PostgreSQL DSN, S3). Ports are picked by the OS (port 0) and
read back from each service's --port-file once it reports SERVING.
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
# Which stages each store user calls (gateway: CreateAvatar's DetectFaces and SubmitJob's mel windows).
CALLS = {"gateway": ("audio", "lipsync"), "render": ("lipsync", "superres")}
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen
    log_path: Path
    module: str = ""
    args: list[str] = field(default_factory=list)
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
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = 120.0
    #: replicas per service (default 1; render 2). Replica 0 is named after the service, the others
    #: "<name>-<i>"; callers get all of a stage's addresses and balance calls over them (round-robin).
    replicas: dict[str, int] = field(default_factory=dict)
    #: GPUs to spread the GPU stages' replicas over (CUDA_VISIBLE_DEVICES, replica i -> gpus[i % n]).
    gpus: list[str] = field(default_factory=list)
    #: job store URL; default an SQLite file in workdir
    job_store: str = ""
    #: blob store URL; default a folder in workdir
    blob_store: str = ""
    processes: dict[str, ServiceProcess] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.replicas = {"render": 2, **self.replicas}
        self.job_store = self.job_store or f"sqlite:///{self.workdir / 'lipline.db'}"
        self.blob_store = self.blob_store or str(self.workdir / "blobs")

    @property
    def blob_dir(self) -> Path:
        """The blob store's folder (when it is one)."""
        return Path(self.blob_store)

    @property
    def gateway_address(self) -> str:
        return self.processes["gateway"].address

    @property
    def gateway_addresses(self) -> list[str]:
        return [self.processes[n].address for n in self.replica_names("gateway")]

    def __enter__(self) -> LocalCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for stage in STAGES:
                for name in self.replica_names(stage):
                    self._start(name, self.extra_args.get(stage, []), stage)
            for stage in STAGES:
                for name in self.replica_names(stage):
                    self._wait_ready(name)
            for service in ("gateway", "render"):
                for name in self.replica_names(service):
                    self.start_service(name)
            for service in ("gateway", "render"):
                for name in self.replica_names(service):
                    self._wait_ready(name)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def replica_names(self, stage: str) -> list[str]:
        return [stage if i == 0 else f"{stage}-{i}" for i in range(self.replicas.get(stage, 1))]

    def service_of(self, name: str) -> str:
        return name.split("-", 1)[0]

    def store_args(self, service: str) -> list[str]:
        """Flags of a gateway or render worker: the stores, its stages' addresses, a local cache."""
        args = [f"--job-store={self.job_store}", f"--blob-store={self.blob_store}"]
        args += [f"--{stage}-address={','.join(self.processes[n].address for n in self.replica_names(stage))}"
                 for stage in CALLS[service]]
        return args

    def start_service(self, name: str, wait: bool = False) -> None:
        """(Re)start a gateway or render worker process by name (tests restart them after a kill)."""
        service = self.service_of(name)
        args = self.store_args(service)
        if service == "render":
            args.append(f"--cache-dir={self.workdir / 'cache' / name}")
        self._start(name, args + self.extra_args.get(service, []), service)
        if wait:
            self._wait_ready(name)

    def restart(self, name: str) -> None:
        """Start a stopped (or killed) process again with the same flags on the same port, and wait for it."""
        old = self.processes[name]
        if old.process.poll() is None:
            raise RuntimeError(f"{name} is still running")
        self._start(name, [*old.args, f"--port={old.port}"], old.module)
        self._wait_ready(name)

    def kill(self, name: str) -> None:
        """SIGKILL one process (no drain) and reap it."""
        proc = self.processes[name].process
        if proc.poll() is None:
            proc.kill()
        proc.wait()

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
        self.processes[name] = ServiceProcess(name, process, log_path, module or name, list(args))

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
        order = [*self.replica_names("gateway"), *self.replica_names("render"), *(n for stage in STAGES for n in self.replica_names(stage))]
        for name in order:
            if name in self.processes:
                self.terminate(name)
