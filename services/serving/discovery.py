"""Discovery: which addresses a stage's channel balances over, kept up to date while the process runs.

A stage address setting selects one:

- `host:port`, `ip1:p1,ip2:p2,...`, `dns:///name:port` (and any other gRPC target) -> StaticDiscovery:
  one channel for the life of the process, resolved by gRPC itself (today's behaviour);
- `k8s:///<service>.<namespace>:<port>` (or `k8s:///<service>:<port>`, this pod's namespace) ->
  KubernetesDiscovery: a watch on the Service's EndpointSlices; only ready endpoints are used;
- `file:///path/addresses.txt` -> FileDiscovery: one `host:port` a line, re-read every 0.5 s (tests and
  hand-run set-ups that change the replica set without an API server).

A DiscoveredChannel holds one grpc.aio channel (round-robin, from `open_channel`) for the current
address set. When the set changes it opens a channel for the new set, swaps it in for new calls at once,
and closes the old one with a grace (its in-flight streams finish; nothing new starts on it). Callers
take a stub per call (`stub(StubClass)`), never keep one, so a new replica gets the next call and a
removed one gets none.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.serving.channels import StageClients, open_channel

_LOGGER = logging.getLogger(__name__)

K8S_SCHEME = "k8s:///"
FILE_SCHEME = "file://"
DEFAULT_GRACE_S = 30.0
FILE_POLL_S = 0.5
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

Listener = Callable[[tuple[str, ...]], None]
StubT = TypeVar("StubT")


class Discovery:
    """The current address set of one stage, and listeners told (on the event loop) when it changes."""

    def __init__(self) -> None:
        self._addresses: tuple[str, ...] = ()
        self._listeners: list[Listener] = []

    @property
    def addresses(self) -> tuple[str, ...]:
        return self._addresses

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _set(self, addresses: Iterable[str]) -> None:
        new = tuple(sorted(set(addresses)))
        if new == self._addresses:
            return
        self._addresses = new
        for listener in list(self._listeners):
            try:
                listener(new)
            except Exception:
                _LOGGER.exception("discovery listener failed")

    async def start(self) -> None:
        """Begin following the source (the first address set may arrive later)."""

    async def close(self) -> None:
        """Stop following the source."""


class StaticDiscovery(Discovery):
    """A fixed set (or one gRPC target such as `dns:///name:port`); `update` changes it by hand."""

    def __init__(self, addresses: Iterable[str]) -> None:
        super().__init__()
        self._set(addresses)

    def update(self, addresses: Iterable[str]) -> None:
        self._set(addresses)


def read_address_file(path: Path) -> list[str]:
    """`host:port` per line; blank lines and `#` comments are skipped."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


class FileDiscovery(Discovery):
    """Addresses from a file, re-read every `poll_s` seconds; a missing or unreadable file keeps the last set."""

    def __init__(self, path: str | Path, poll_s: float = FILE_POLL_S) -> None:
        super().__init__()
        self.path = Path(path)
        self.poll_s = poll_s
        self._task: asyncio.Task | None = None
        self._read()

    def _read(self) -> None:
        try:
            addresses = read_address_file(self.path)
        except OSError as exc:
            _LOGGER.warning(
                "address file unreadable; keeping the last set", extra={"path": str(self.path), "error": str(exc)}
            )
            return
        self._set(addresses)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._poll(), name=f"discovery-file-{self.path.name}")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            self._read()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


def endpoint_slice_addresses(endpoint_slice: Any, port: int) -> set[str]:
    """`ip:port` (`[ip]:port` for IPv6) of the slice's ready endpoints (a V1EndpointSlice).

    The EndpointSlice API says an unknown `ready` (None) is to be read as ready; `false` is not ready
    (a pod that fails its readiness probe, or is terminating). One address per endpoint: the API
    treats an endpoint's addresses as interchangeable. FQDN slices are not used.
    """
    address_type = getattr(endpoint_slice, "address_type", "IPv4") or "IPv4"
    if address_type not in ("IPv4", "IPv6"):
        return set()
    found = set()
    for endpoint in endpoint_slice.endpoints or ():
        conditions = endpoint.conditions
        ready = None if conditions is None else conditions.ready
        if ready is False or not endpoint.addresses:
            continue
        ip = endpoint.addresses[0]
        found.add(f"[{ip}]:{port}" if address_type == "IPv6" else f"{ip}:{port}")
    return found


class KubernetesDiscovery(Discovery):
    """The ready endpoints of a Service, from a watch on its EndpointSlices (discovery.k8s.io/v1).

    The kubernetes client is synchronous, so the list-then-watch loop runs on a daemon thread and hands
    each new address set to the event loop. A watch that ends (its `timeout_seconds`, a dropped
    connection, 410 Gone) is followed by a fresh list, so no change is lost; errors back off up to 10 s.
    Needs RBAC: list and watch on `endpointslices` in the namespace.
    """

    WATCH_TIMEOUT_S = 300

    def __init__(
        self, service: str, namespace: str, port: int, api: Any = None, first_list_timeout_s: float = 10.0
    ) -> None:
        super().__init__()
        self.service, self.namespace, self.port = service, namespace, port
        self._api = api
        self._first_list_timeout_s = first_list_timeout_s
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def label_selector(self) -> str:
        return f"kubernetes.io/service-name={self.service}"

    async def start(self) -> None:
        if self._thread is not None:
            return
        if self._api is None:
            from kubernetes import client, config

            config.load_incluster_config()
            self._api = client.DiscoveryV1Api()
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=f"discovery-k8s-{self.service}", daemon=True)
        self._thread.start()
        # The first list (usually milliseconds) gives the channel its first set before anyone calls.
        await asyncio.to_thread(self._first.wait, self._first_list_timeout_s)
        await asyncio.sleep(0)  # let the loop run the hand-over the thread scheduled

    def _publish(self, slices: dict[str, set[str]]) -> None:
        addresses = set().union(*slices.values()) if slices else set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._set, addresses)

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        backoff = 0.5
        while not self._stop.is_set():
            try:
                listed = self._api.list_namespaced_endpoint_slice(self.namespace, label_selector=self.label_selector)
                slices = {s.metadata.name: endpoint_slice_addresses(s, self.port) for s in listed.items or ()}
                self._publish(slices)
                self._first.set()
                backoff = 0.5
                self._watch = watch.Watch(return_type="V1EndpointSlice")
                for event in self._watch.stream(
                    self._api.list_namespaced_endpoint_slice,
                    self.namespace,
                    label_selector=self.label_selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=self.WATCH_TIMEOUT_S,
                ):
                    if self._stop.is_set():
                        break
                    kind, obj = event["type"], event["object"]
                    if kind in ("ADDED", "MODIFIED"):
                        slices[obj.metadata.name] = endpoint_slice_addresses(obj, self.port)
                    elif kind == "DELETED":
                        slices.pop(obj.metadata.name, None)
                    else:  # BOOKMARK
                        continue
                    self._publish(slices)
            except ApiException as exc:
                if self._stop.is_set():
                    break
                if exc.status != 410:  # 410 Gone: the watch's version expired; list again now
                    _LOGGER.warning(
                        "endpointslice watch failed",
                        extra={"service": self.service, "status": exc.status, "reason": exc.reason},
                    )
                    self._stop.wait(backoff)
                    backoff = min(10.0, backoff * 2)
            except Exception as exc:  # noqa: BLE001 - the API server going away must not end discovery
                if self._stop.is_set():
                    break
                _LOGGER.warning("endpointslice watch failed", extra={"service": self.service, "error": repr(exc)})
                self._stop.wait(backoff)
                backoff = min(10.0, backoff * 2)

    async def close(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 2.0)


def parse_k8s_target(address: str) -> tuple[str, str, int]:
    """`k8s:///<service>[.<namespace>]:<port>` -> (service, namespace, port)."""
    rest = address[len(K8S_SCHEME) :]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r}: expected k8s:///<service>.<namespace>:<port>")
    service, _, namespace = host.partition(".")
    namespace = namespace.split(".", 1)[0]  # service.namespace.svc.cluster.local is accepted too
    if not namespace:
        namespace = SA_NAMESPACE_FILE.read_text().strip() if SA_NAMESPACE_FILE.exists() else "default"
    return service, namespace, int(port)


def discovery_for(address: str) -> Discovery:
    """The Discovery an address setting selects (see the module docstring)."""
    if address.startswith(K8S_SCHEME):
        return KubernetesDiscovery(*parse_k8s_target(address))
    if address.startswith(FILE_SCHEME):
        return FileDiscovery(address[len(FILE_SCHEME) :])
    if "," in address and ":///" not in address and not address.startswith(("ipv4:", "ipv6:", "unix:")):
        return StaticDiscovery(a.strip() for a in address.split(",") if a.strip())
    return StaticDiscovery([address])


class NoAddresses(grpc.aio.AioRpcError):
    """No ready address yet: UNAVAILABLE, so callers treat it like any unreachable stage (retryable)."""

    def __init__(self, what: str) -> None:
        super().__init__(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), f"{what}: no ready address"
        )


class DiscoveredChannel:
    """One channel for the current address set of a Discovery, swapped when the set changes."""

    def __init__(
        self, discovery: Discovery, max_message_bytes: int, grace_s: float = DEFAULT_GRACE_S, name: str = ""
    ) -> None:
        self.discovery = discovery
        self.max_message_bytes = max_message_bytes
        self.grace_s = grace_s
        self.name = name
        self.swaps = 0
        self._channel: grpc.aio.Channel | None = None
        self._target = ""
        self._retiring: set[asyncio.Task] = set()
        # open_channel reads context (the internal token): channels opened later, from a discovery
        # callback, use the context of the service's start-up, where this object is made.
        self._context = contextvars.copy_context()
        self._closed = False

    @property
    def channel(self) -> grpc.aio.Channel | None:
        return self._channel

    @property
    def target(self) -> str:
        """The address list of the current channel ("" = none)."""
        return self._target

    async def start(self) -> None:
        self.discovery.subscribe(self._on_change)
        await self.discovery.start()
        self._on_change(self.discovery.addresses)

    def stub(self, stub_class: Callable[[grpc.aio.Channel], StubT]) -> StubT:
        """A stub on the current channel: take one per call (or stream), never keep it."""
        if self._channel is None:
            raise NoAddresses(self.name or "stage")
        return stub_class(self._channel)

    def _on_change(self, addresses: tuple[str, ...]) -> None:
        if self._closed:
            return
        target = ",".join(addresses)
        if target == self._target:
            return
        if not addresses:  # every replica gone or unready: keep the last channel (its calls fail or wait)
            _LOGGER.warning(
                "no ready addresses; keeping the last channel", extra={"stage": self.name, "target": self._target}
            )
            return
        old = self._channel
        self._channel = self._context.run(open_channel, target, self.max_message_bytes)
        self._target = target
        self.swaps += 1
        _LOGGER.info("stage addresses changed", extra={"stage": self.name, "addresses": list(addresses)})
        if old is not None:
            task = asyncio.get_running_loop().create_task(self._retire(old))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, channel: grpc.aio.Channel) -> None:
        """Close an old channel: its in-flight calls have `grace_s` to finish; no new call starts there."""
        await channel.close(grace=self.grace_s)

    async def close(self) -> None:
        self._closed = True
        await self.discovery.close()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)


class DiscoveredStageClients(StageClients):
    """StageClients (health checks, `wait_serving`) whose channels follow each stage's Discovery.

    `stub(stage, StubClass)` is how callers reach a stage: a stub on that stage's current channel.
    Call `await start()` before `wait_serving`.
    """

    def __init__(self, addresses: dict[str, str], max_message_bytes: int, grace_s: float = DEFAULT_GRACE_S) -> None:
        # StageClients.__init__ would open channels on the raw settings (`k8s:///`, `file://` are not gRPC targets).
        self.addresses = dict(addresses)
        self.providers = {
            name: DiscoveredChannel(discovery_for(address), max_message_bytes, grace_s, name)
            for name, address in self.addresses.items()
        }

    @property
    def channels(self) -> dict[str, grpc.aio.Channel | None]:  # type: ignore[override]  # read-only, None until discovered; check/close are overridden
        return {name: p.channel for name, p in self.providers.items()}

    async def start(self) -> None:
        for provider in self.providers.values():
            await provider.start()

    def stub(self, stage: str, stub_class: Callable[[grpc.aio.Channel], StubT]) -> StubT:
        return self.providers[stage].stub(stub_class)

    async def check(self, stage: str, timeout: float = 2.0) -> bool:
        """True when the stage reports SERVING (False while it has no address)."""
        try:
            stub = self.stub(stage, health_pb2_grpc.HealthStub)
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def close(self) -> None:
        for provider in self.providers.values():
            await provider.close()


__all__ = [
    "DiscoveredChannel",
    "DiscoveredStageClients",
    "Discovery",
    "FileDiscovery",
    "KubernetesDiscovery",
    "NoAddresses",
    "StaticDiscovery",
    "discovery_for",
    "endpoint_slice_addresses",
    "parse_k8s_target",
    "read_address_file",
]
