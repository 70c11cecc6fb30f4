"""Start lipline's services as real processes on 127.0.0.1 and stop them with SIGTERM.

Used by the demo (`python -m services.local`) and the integration tests: the same processes, the
same flags and the same health checks as in a pod, just on one machine: every stage of the registry
(services.serving.stages), one or more gateways, two or more render workers and, when asked, live
workers (`python -m services.local serve` starts one), sharing the embedded stores (an SQLite file
and a local folder) or the ones given (a PostgreSQL DSN, S3). Ports are picked by the OS (port 0)
and read back from each service's --port-file once it reports SERVING (services.local.process,
which the benchmarks use too).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from services.local.affinity import gpu_of, lowest_free_slot
from services.local.process import REPO_ROOT, ServiceProcess, start
from services.serving.stages import STAGES as REGISTRY
from services.serving.stages import called_stages, start_order

__all__ = ["CALLS", "DEFAULT_REPLICAS", "REPO_ROOT", "STAGES", "LocalCluster", "ServiceProcess", "started_stages"]

#: the stages the others call (audio, lipsync, lipsync-musetalk, superres), started first where started
STAGES = called_stages()
#: replicas of the services a cluster is not told about: 1, except render 2; live and web 0 (started where
#: asked: local mode's serve, the tests of live sessions and of the page); the registry's optional stages
#: (lipsync-musetalk) 0, as in the chart, where their callers run without them
DEFAULT_REPLICAS: Mapping[str, int] = MappingProxyType(
    {"render": 2, "live": 0, "web": 0, **{s.name: 0 for s in REGISTRY.values() if s.optional}}
)
#: which stages each caller dials (gateway: CreateAvatar's DetectFaces and SubmitJob's mel windows)
CALLS = {s.name: s.calls for s in REGISTRY.values() if s.calls}
# What every local process gets: loopback, ports picked by the OS, JSON logs, a short drain.
LOCAL_FLAGS = ("--host=127.0.0.1", "--port=0", "--metrics-port=0", "--log-format=json", "--grace-s=10")


def started_stages(replicas: Mapping[str, int] | None = None) -> tuple[str, ...]:
    """The called stages (STAGES) a cluster with these `replicas` starts; by default a plain cluster's.

    Health loops and per-stage tests iterate these, never the whole registry: an optional stage is
    not started unless asked for."""
    counts = {**DEFAULT_REPLICAS, **(replicas or {})}
    return tuple(name for name in STAGES if counts.get(name, 1) > 0)


@dataclass
class LocalCluster:
    """Context manager: `with LocalCluster(workdir) as c: LiplineClient(c.gateway_address)`."""

    workdir: Path
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = 120.0
    #: replicas per service (the others as DEFAULT_REPLICAS says: 1; render 2; live, web and lipsync-musetalk
    #: 0: started where asked, by local mode's serve and --musetalk and the tests that need them). Replica 0 is named after the service, the others
    #: "<name>-<i>"; callers get all of a stage's addresses and balance calls over them (round-robin).
    #: Live workers are opt-in (`replicas={"live": 1}`): only live sessions need one, and most clusters
    #: (the demo, the job benchmarks, most integration tests) render jobs only.
    replicas: dict[str, int] = field(default_factory=dict)
    #: GPUs to spread the GPU stages' replicas over (CUDA_VISIBLE_DEVICES, replica slot i -> gpus[i % n];
    #: services/local/affinity.py: replicas started in order take slots 0, 1, ..., a later one the lowest free).
    gpus: list[str] = field(default_factory=list)
    #: per stage, the cores its replicas are pinned to (slot i -> cores[stage][i % n]); stages not named
    #: keep the affinity they inherit from the process that starts the cluster
    cores: dict[str, list[list[int]]] = field(default_factory=dict)
    #: job store URL; default an SQLite file in workdir
    job_store: str = ""
    #: blob store URL; default a folder in workdir
    blob_store: str = ""
    #: callers find a stage's replicas in an address file (`file://`, services.serving.discovery) instead
    #: of a fixed list, so replicas can come and go (the local autoscaler rewrites the files)
    address_files: bool = False
    processes: dict[str, ServiceProcess] = field(default_factory=dict)
    #: each process's replica slot (kept across a restart: the same GPU and cores again)
    slots: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.replicas = {**DEFAULT_REPLICAS, **self.replicas}
        self.job_store = self.job_store or f"sqlite:///{self.workdir / 'lipline.db'}"
        self.blob_store = self.blob_store or str(self.workdir / "blobs")

    @property
    def stages(self) -> tuple[str, ...]:
        """The called stages this cluster runs (at least one replica), in registry order."""
        return started_stages(self.replicas)

    @property
    def blob_dir(self) -> Path:
        """The blob store's folder (when it is one)."""
        return Path(self.blob_store)

    @property
    def gateway_address(self) -> str:
        return self.processes["gateway"].address

    @property
    def web_url(self) -> str:
        """The web page's address (a cluster started with replicas={"web": 1})."""
        return self.processes["web"].url

    @property
    def gateway_addresses(self) -> list[str]:
        return [self.processes[n].address for n in self.replica_names("gateway")]

    def __enter__(self) -> LocalCluster:
        """Start the stages wave by wave (services.serving.stages.start_order): callers after what they call."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for wave in start_order():
                names = [name for stage in wave for name in self.replica_names(stage)]
                for name in names:
                    self.start_service(name)
                for name in names:
                    self._wait_ready(name)
                for stage in wave:
                    self.publish_addresses(stage, self.replica_names(stage))
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def replica_names(self, stage: str) -> list[str]:
        return [stage if i == 0 else f"{stage}-{i}" for i in range(self.replicas.get(stage, 1))]

    def service_of(self, name: str) -> str:
        """The stage a process name runs: the name itself, or a replica's "<stage>-<i>" less its number."""
        if name in REGISTRY:
            return name
        stage, _, number = name.rpartition("-")
        return stage if number.isdigit() and stage in REGISTRY else name.split("-", 1)[0]

    def store_args(self, service: str) -> list[str]:
        """The flags a stage gets from the cluster: the stores, its stages' addresses (all replicas, or their file)."""
        s = REGISTRY[service]
        args = [f"--job-store={self.job_store}", f"--blob-store={self.blob_store}"] if s.stores else []
        args += [
            f"--{stage}-address=file://{self.address_file(stage)}"
            if self.address_files and self.replica_names(stage)
            else f"--{stage}-address={','.join(self.processes[n].address for n in self.replica_names(stage))}"
            for stage in s.calls
        ]  # an optional stage not started: an empty address, "not deployed" to its callers
        return args

    def address_file(self, stage: str) -> Path:
        return self.workdir / "addresses" / f"{stage}.txt"

    def publish_addresses(self, stage: str, names: list[str]) -> None:
        """With address_files, write the addresses of `names` as the stage's list (atomically: a
        reader never sees half a file). Callers pick the change up within their poll (0.5 s)."""
        if not self.address_files or stage not in STAGES:
            return
        path = self.address_file(stage)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(f"{self.processes[n].address}\n" for n in names))
        tmp.replace(path)

    def start_service(self, name: str, wait: bool = False) -> None:
        """(Re)start a process by name with the cluster's flags and extra_args (tests restart one after a kill)."""
        service = self.service_of(name)
        args = self.store_args(service)
        if REGISTRY[service].cache:
            args.append(f"--cache-dir={self.workdir / 'cache' / name}")
        if REGISTRY[service].http_port:
            args.append("--http-port=0")  # like the gRPC ports: the OS picks (extra_args may pin it)
        self._start(name, args + self.extra_args.get(service, []), service)
        if wait:
            self._wait_ready(name)

    def restart(self, name: str, port_wait_s: float = 30.0) -> None:
        """Start a stopped (or killed) process again with the same flags on the same port, and wait for it.

        Between the kill and the bind, the port is free for the OS to hand to any other socket (a
        client's outgoing connection takes its local port from the same range): while the new process
        fails to bind, it is started again for up to `port_wait_s` (such a connection is short-lived)."""
        old = self.processes[name]
        if old.process.poll() is None:
            raise RuntimeError(f"{name} is still running")
        deadline = time.monotonic() + port_wait_s
        while True:
            self._start(name, [*old.args, f"--port={old.port}"], old.module)
            try:
                self._wait_ready(name)
                return
            except RuntimeError as exc:
                taken = "Address already in use" in str(exc)  # gRPC core's words in the log's tail
                if not taken or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    def add_replica(self, stage: str) -> str:
        """Start one more replica of `stage` in the running cluster, wait until it serves; its name.

        Its callers keep the addresses they were started with, so this suits stages nobody dials
        directly: live workers, which the gateway finds through the job store (a test adds one to a
        shared cluster instead of starting a cluster of its own).
        """
        self.replicas[stage] = self.replicas.get(stage, 1) + 1
        name = self.replica_names(stage)[-1]
        self.start_service(name, wait=True)
        return name

    def remove_replica(self, stage: str) -> int:
        """SIGTERM the newest replica of `stage`, wait for it to drain and forget it; its exit code."""
        name = self.replica_names(stage)[-1]
        self.replicas[stage] -= 1
        return self.processes.pop(name).terminate()

    def kill(self, name: str) -> None:
        """SIGKILL one process (no drain) and reap it."""
        self.processes[name].kill()

    def slot_of(self, name: str) -> int:
        """The replica slot of process `name` (which GPU and cores it gets): the one it had before (a
        restart) while no other running replica of its stage holds it, else the lowest no such one holds."""
        service = self.service_of(name)
        taken = {
            self.slots[other]
            for other, proc in self.processes.items()
            if other != name
            and other in self.slots
            and self.service_of(other) == service
            and proc.process.poll() is None
        }
        if name in self.slots and self.slots[name] not in taken:
            return self.slots[name]
        self.slots[name] = lowest_free_slot(taken)
        return self.slots[name]

    def _start(self, name: str, args: list[str], module: str | None = None) -> None:
        module = module or name
        slot = self.slot_of(name)
        gpu = gpu_of(self.gpus, slot) if REGISTRY[module].gpu else None
        sets = self.cores.get(module)
        self.processes[name] = start(
            name,
            module,
            args,
            self.workdir,
            base_args=LOCAL_FLAGS,
            env=self.env,
            cuda_visible_devices=gpu,
            cpus=sets[slot % len(sets)] if sets else None,
        )

    def _wait_ready(self, name: str) -> None:
        self.processes[name].wait_ready(self.start_timeout_s)

    def terminate(self, name: str, timeout: float = 30.0) -> int:
        """SIGTERM one service and wait for it to exit; returns its exit code."""
        return self.processes[name].terminate(timeout)

    def stop(self) -> None:
        """SIGTERM every process, callers before the stages they call (each wave drains together)."""
        for wave in reversed(start_order()):
            procs = [p for name, p in reversed(self.processes.items()) if self.service_of(name) in wave]
            for proc in procs:
                proc.signal_stop()
            for proc in procs:
                proc.terminate()
