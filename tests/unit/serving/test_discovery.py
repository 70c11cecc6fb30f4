"""Discovery (static, address file, Kubernetes EndpointSlices) and the channel that follows it.

No API server runs here: KubernetesDiscovery is driven by a fake DiscoveryV1Api whose
`list_namespaced_endpoint_slice` returns real kubernetes.client models when listing and, with
`watch=True`, a response streaming watch events (JSON lines) that kubernetes.watch.Watch parses as it
would an API server's.
"""

from __future__ import annotations

import asyncio
import json
import queue
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.client.models import (
    V1Endpoint,
    V1EndpointConditions,
    V1EndpointSlice,
    V1EndpointSliceList,
    V1ListMeta,
    V1ObjectMeta,
)

from services.serving.discovery import (
    DiscoveredChannel,
    DiscoveredStageClients,
    FileDiscovery,
    KubernetesDiscovery,
    NoAddresses,
    StaticDiscovery,
    discovery_for,
    endpoint_slice_addresses,
    parse_k8s_target,
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def until(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)
    return result


# ----- parsing and the static / file sources -----


@pytest.mark.parametrize(
    ("setting", "kind", "addresses"),
    [
        ("127.0.0.1:50062", StaticDiscovery, ("127.0.0.1:50062",)),
        ("10.0.0.6:1, 10.0.0.5:1", StaticDiscovery, ("10.0.0.5:1", "10.0.0.6:1")),
        ("dns:///lipline-lipsync.ns.svc:50062", StaticDiscovery, ("dns:///lipline-lipsync.ns.svc:50062",)),
        ("ipv4:10.0.0.5:1,10.0.0.6:2", StaticDiscovery, ("ipv4:10.0.0.5:1,10.0.0.6:2",)),
        ("k8s:///lipline-lipsync.prod:50062", KubernetesDiscovery, ()),
    ],
)
def test_discovery_for(setting: str, kind: type, addresses: tuple[str, ...]) -> None:
    d = discovery_for(setting)
    assert type(d) is kind
    assert d.addresses == addresses


def test_parse_k8s_target() -> None:
    assert parse_k8s_target("k8s:///lipline-lipsync.prod:50062") == ("lipline-lipsync", "prod", 50062)
    assert parse_k8s_target("k8s:///lipsync.prod.svc.cluster.local:1") == ("lipsync", "prod", 1)
    with pytest.raises(ValueError):
        parse_k8s_target("k8s:///lipsync.prod")


def test_static_discovery_notifies_changes_only() -> None:
    d = StaticDiscovery(["b:1", "a:1"])
    seen: list[tuple[str, ...]] = []
    d.subscribe(seen.append)
    d.update(["a:1", "b:1"])  # same set, other order
    d.update(["a:1", "b:1", "c:1"])
    assert d.addresses == ("a:1", "b:1", "c:1")
    assert seen == [("a:1", "b:1", "c:1")]


def test_file_discovery_rereads(tmp_path: Path) -> None:
    path = tmp_path / "addresses.txt"
    path.write_text("127.0.0.1:1\n\n# a comment\n127.0.0.1:2  # second\n")

    async def main() -> None:
        d = discovery_for(f"file://{path}")
        assert isinstance(d, FileDiscovery)
        d.poll_s = 0.05
        assert d.addresses == ("127.0.0.1:1", "127.0.0.1:2")
        await d.start()
        path.write_text("127.0.0.1:3\n")
        await until(lambda: d.addresses == ("127.0.0.1:3",))
        path.unlink()  # missing: keep the last set
        await asyncio.sleep(0.2)
        assert d.addresses == ("127.0.0.1:3",)
        await d.close()

    asyncio.run(main())


# ----- the channel swap, with real gRPC servers -----


async def health_server(status: int) -> tuple[grpc.aio.Server, health.aio.HealthServicer, str]:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    await servicer.set("", status)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, servicer, f"127.0.0.1:{port}"


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())


def test_channel_swaps_for_new_calls_and_lets_streams_finish() -> None:
    async def main() -> None:
        a, a_health, a_addr = await health_server(SERVING)
        b, _, b_addr = await health_server(NOT_SERVING)  # the status tells which server answered
        discovery = StaticDiscovery([a_addr])
        provider = DiscoveredChannel(discovery, 4 << 20, grace_s=5.0, name="lipsync")
        await provider.start()
        stub = provider.stub(health_pb2_grpc.HealthStub)
        assert (await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)).status == SERVING
        stream = stub.Watch(health_pb2.HealthCheckRequest())  # in flight on A's channel
        assert (await stream.read()).status == SERVING
        old = provider.channel

        discovery.update([b_addr])
        assert provider.channel is not old and provider.target == b_addr and provider.swaps == 2
        new_stub = provider.stub(health_pb2_grpc.HealthStub)
        assert (await new_stub.Check(health_pb2.HealthCheckRequest(), timeout=5)).status == NOT_SERVING
        # The old channel still carries its stream (within the grace), and takes no new call.
        await a_health.set("", NOT_SERVING)
        assert (await asyncio.wait_for(stream.read(), 5)).status == NOT_SERVING
        with pytest.raises(Exception):
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
        stream.cancel()
        await until(lambda: not provider._retiring)  # closed once its last call ended

        discovery.update([a_addr, b_addr])  # both: round-robin reaches each
        statuses = set()
        for _ in range(6):
            reply = await provider.stub(health_pb2_grpc.HealthStub).Check(health_pb2.HealthCheckRequest(), timeout=5)
            statuses.add(reply.status)
        assert statuses == {NOT_SERVING}  # A is NOT_SERVING now too; both answered without error
        discovery.update([])  # nothing ready: keep the last channel
        assert provider.target == ",".join(sorted([a_addr, b_addr]))
        await provider.close()
        await a.stop(None)
        await b.stop(None)

    run(main)


def test_stage_clients_wait_for_a_first_address(tmp_path: Path) -> None:
    path = tmp_path / "addresses.txt"
    path.write_text("")

    async def main() -> None:
        server, _, addr = await health_server(SERVING)
        clients = DiscoveredStageClients({"lipsync": f"file://{path}"}, 4 << 20)
        clients.providers["lipsync"].discovery.poll_s = 0.05
        await clients.start()
        assert not await clients.check("lipsync")
        with pytest.raises(NoAddresses) as err:
            clients.stub("lipsync", health_pb2_grpc.HealthStub)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        path.write_text(addr + "\n")
        await clients.wait_serving(5.0)
        assert clients.channels["lipsync"] is not None
        await clients.close()
        await server.stop(None)

    run(main)


# ----- the Kubernetes watch, against a fake API -----


def endpoint_slice(name: str, endpoints: list[tuple[str, bool | None]], version: str = "1") -> V1EndpointSlice:
    return V1EndpointSlice(
        address_type="IPv4",
        metadata=V1ObjectMeta(name=name, resource_version=version, labels={"kubernetes.io/service-name": "lipsync"}),
        endpoints=[V1Endpoint(addresses=[ip], conditions=V1EndpointConditions(ready=ready)) for ip, ready in endpoints],
    )


class FakeWatchResponse:
    """What the API client returns with `_preload_content=False`: lines of JSON watch events."""

    def __init__(self, events: queue.Queue) -> None:
        self.events = events
        self.closed = False

    def stream(self, amt: Any = None, decode_content: Any = None) -> Any:
        while True:
            line = self.events.get()
            if line is None:
                return
            yield line.encode()

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        pass


class FakeDiscoveryApi:
    """kubernetes.client.DiscoveryV1Api's `list_namespaced_endpoint_slice`, in memory."""

    def __init__(self, slices: list[V1EndpointSlice]) -> None:
        self.slices = {s.metadata.name: s for s in slices}
        self.events: queue.Queue = queue.Queue()
        self.calls: list[dict] = []
        self.version = 1

    def list_namespaced_endpoint_slice(self, namespace: str, **kwargs: Any) -> Any:
        """:rtype: V1EndpointSliceList"""
        self.calls.append({"namespace": namespace, **kwargs})
        if kwargs.get("watch"):
            assert kwargs["_preload_content"] is False
            return FakeWatchResponse(self.events)
        return V1EndpointSliceList(
            items=list(self.slices.values()), metadata=V1ListMeta(resource_version=str(self.version))
        )

    def push(self, kind: str, obj: V1EndpointSlice) -> None:
        """An event on the watch; the stored state follows (a later list sees it)."""
        self.version += 1
        obj.metadata.resource_version = str(self.version)
        if kind == "DELETED":
            self.slices.pop(obj.metadata.name, None)
        else:
            self.slices[obj.metadata.name] = obj
        raw = ApiClient().sanitize_for_serialization(obj)
        self.events.put(json.dumps({"type": kind, "object": raw}) + "\n")

    def gone(self) -> None:
        self.events.put(
            json.dumps({"type": "ERROR", "object": {"code": 410, "reason": "Gone", "message": "too old"}}) + "\n"
        )


def test_endpoint_slice_addresses_keep_ready_ones() -> None:
    s = endpoint_slice("a", [("10.0.0.1", True), ("10.0.0.2", False), ("10.0.0.3", None)])
    assert endpoint_slice_addresses(s, 50062) == {"10.0.0.1:50062", "10.0.0.3:50062"}
    s6 = V1EndpointSlice(
        address_type="IPv6",
        metadata=V1ObjectMeta(name="b"),
        endpoints=[V1Endpoint(addresses=["fd00::1"], conditions=V1EndpointConditions(ready=True))],
    )
    assert endpoint_slice_addresses(s6, 1) == {"[fd00::1]:1"}
    fqdn = V1EndpointSlice(
        address_type="FQDN", metadata=V1ObjectMeta(name="c"), endpoints=[V1Endpoint(addresses=["x.example"])]
    )
    assert endpoint_slice_addresses(fqdn, 1) == set()


def test_kubernetes_discovery_follows_endpoint_slices() -> None:
    api = FakeDiscoveryApi([endpoint_slice("lipsync-a", [("10.0.0.1", True), ("10.0.0.2", False)])])

    async def main() -> None:
        d = KubernetesDiscovery("lipsync", "prod", 50062, api=api)
        seen: list[tuple[str, ...]] = []
        d.subscribe(seen.append)
        await d.start()
        assert d.addresses == ("10.0.0.1:50062",)  # the first list, before start() returns
        first = api.calls[0]
        assert first == {"namespace": "prod", "label_selector": "kubernetes.io/service-name=lipsync"}

        api.push("MODIFIED", endpoint_slice("lipsync-a", [("10.0.0.1", True), ("10.0.0.2", True)]))  # became ready
        await until(lambda: d.addresses == ("10.0.0.1:50062", "10.0.0.2:50062"))
        watch_call = api.calls[1]
        assert watch_call["watch"] is True and watch_call["resource_version"] == "1"
        assert watch_call["label_selector"] == "kubernetes.io/service-name=lipsync"

        api.push("ADDED", endpoint_slice("lipsync-b", [("10.0.0.9", True)]))
        await until(lambda: "10.0.0.9:50062" in d.addresses)
        api.push("MODIFIED", endpoint_slice("lipsync-a", [("10.0.0.1", False), ("10.0.0.2", True)]))  # unready
        await until(lambda: d.addresses == ("10.0.0.2:50062", "10.0.0.9:50062"))
        api.push("DELETED", endpoint_slice("lipsync-a", []))
        await until(lambda: d.addresses == ("10.0.0.9:50062",))

        # 410 Gone: the watch's version expired; discovery lists again and watches from there.
        api.slices["lipsync-c"] = endpoint_slice("lipsync-c", [("10.0.0.7", True)])  # missed by the watch
        api.gone()
        await until(lambda: d.addresses == ("10.0.0.7:50062", "10.0.0.9:50062"))
        assert sum(1 for c in api.calls if not c.get("watch")) == 2
        assert seen[-1] == d.addresses

        api.events.put(None)  # end the fake stream so the thread can exit
        await d.close()

    asyncio.run(main())


def test_kubernetes_discovery_retries_after_api_errors() -> None:
    class Failing(FakeDiscoveryApi):
        failures = 2

        def list_namespaced_endpoint_slice(self, namespace: str, **kwargs: Any) -> Any:
            if not kwargs.get("watch") and self.failures:
                self.failures -= 1
                raise ApiException(status=403, reason="Forbidden")
            return super().list_namespaced_endpoint_slice(namespace, **kwargs)

    api = Failing([endpoint_slice("lipsync-a", [("10.0.0.1", True)])])

    async def main() -> None:
        d = KubernetesDiscovery("lipsync", "prod", 50062, api=api, first_list_timeout_s=0.1)
        await d.start()
        await until(lambda: d.addresses == ("10.0.0.1:50062",), timeout=10)
        api.events.put(None)
        await d.close()

    asyncio.run(main())
