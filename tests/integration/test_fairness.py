"""Hostile clients cannot starve others: per-client and global caps on concurrent calls (health
checks exempt), per-client caps on queued jobs, bounded memory for downloads nobody reads, and a
`LiplineClient.wait` that survives a gateway restart.

The gateway here has small caps (16 calls per client, 40 in all, 2 queued jobs per client) and no
render workers, so submitted jobs stay QUEUED and their WatchJob streams stay open and idle. Every
call comes from 127.0.0.1, so the tests tell clients apart by their `x-api-key` metadata (without
one, a client is its IP address: every key-less caller here is the same client).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2

from lipline.v1 import gateway_pb2, gateway_pb2_grpc
from services.gateway.client import LiplineClient
from services.jobs.store import open_job_store
from services.jobs.store.jobs import AvatarRecord, JobStore
from services.local.cluster import LocalCluster
from tests.integration.util import (
    SAMPLES,
    cut_wav,
    eventually,
    finish_job,
    health_status,
    new_job,
    rss_mb,
    start_cluster,
)

PER_CLIENT, IN_ALL, JOBS_PER_CLIENT = 16, 40, 2
MiB = 1 << 20
OUTPUT_BYTES = 48 * MiB
# What one DownloadOutput stream blocked on a client that reads nothing may cost the gateway: a few
# 1 MiB chunks in flight (ours, the message, its serialization, gRPC's), plus allocator slack.
# Measured: 5-6 MiB. Reading the output ahead would cost all of OUTPUT_BYTES per stream.
STREAM_BUDGET = 10 * MiB


@dataclass
class Fixture:
    cluster: LocalCluster
    store: JobStore
    queued: str  # a job that stays QUEUED (nothing renders here): its WatchJob streams are idle
    finished: str  # a SUCCEEDED job whose output is OUTPUT_BYTES of noise


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    gateway = [
        f"--max-streams-per-client={PER_CLIENT}",
        f"--max-concurrent-streams={IN_ALL}",
        f"--max-active-jobs-per-client={JOBS_PER_CLIENT}",
    ]
    with start_cluster(
        tmp_path_factory.mktemp("fairness"), extra_args={"gateway": gateway}, replicas={"render": 0}
    ) as cluster:
        store = open_job_store(cluster.job_store)
        try:
            finished = new_job(store)  # first, while no other job has claimable tasks
            noise = np.random.default_rng(0).integers(0, 256, OUTPUT_BYTES, dtype=np.uint8).tobytes()
            finish_job(store, finished, noise, cluster.blob_store)
            yield Fixture(cluster, store, new_job(store), finished)
        finally:
            store.close()


def stub(channel: grpc.Channel) -> gateway_pb2_grpc.GatewayStub:
    return gateway_pb2_grpc.GatewayStub(channel)


def key(name: str) -> tuple[tuple[str, str], ...]:
    return (("x-api-key", name),)


class Watches:
    """Idle WatchJob streams of one client, opened one by one: those the gateway took and those it refused."""

    def __init__(self, channel: grpc.Channel, job_id: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.gateway, self.job_id, self.metadata = stub(channel), job_id, metadata
        self.open: list = []
        self.refused: list[grpc.RpcError] = []

    def add(self, n: int) -> Watches:
        for _ in range(n):
            call = self.gateway.WatchJob(
                gateway_pb2.WatchJobRequest(job_id=self.job_id), timeout=300, metadata=self.metadata
            )
            try:
                assert next(call).job.state == gateway_pb2.JOB_STATE_QUEUED
                self.open.append(call)
            except grpc.RpcError as exc:
                self.refused.append(exc)
        return self

    def close(self) -> None:
        for call in self.open:
            call.cancel()
        self.open.clear()


def assert_refused(errors: list[grpc.RpcError], *words: str) -> None:
    for err in errors:
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (err.code(), err.details())
        for word in words:
            assert word in err.details(), (word, err.details())
        assert "retry later" in err.details()
        assert dict(err.trailing_metadata() or ())["retry-after-ms"].isdigit()


def test_one_clients_idle_streams_starve_neither_health_nor_other_clients(fx: Fixture) -> None:
    address = fx.cluster.gateway_address
    problems: list[str] = []
    stop = threading.Event()

    def other_client() -> None:
        """Health checks and another client's calls, all the while client A floods the gateway."""
        with grpc.insecure_channel(address) as channel:
            b = stub(channel)
            while not stop.is_set():
                try:
                    if health_status(address) != health_pb2.HealthCheckResponse.SERVING:
                        problems.append("health: not SERVING")
                    b.GetJob(gateway_pb2.GetJobRequest(job_id=fx.queued), timeout=10, metadata=key("b"))
                    b.ListAvatars(gateway_pb2.ListAvatarsRequest(), timeout=10, metadata=key("b"))
                except grpc.RpcError as exc:
                    problems.append(f"{exc.code().name}: {exc.details()}")
                time.sleep(0.02)

    checker = threading.Thread(target=other_client)
    with grpc.insecure_channel(address) as a_channel, grpc.insecure_channel(address) as c_channel:
        a = Watches(a_channel, fx.queued)  # no key: client "ip:127.0.0.1"
        c, d = Watches(c_channel, fx.queued, key("c")), Watches(c_channel, fx.queued, key("d"))
        checker.start()
        try:
            a.add(256)
            assert (len(a.open), len(a.refused)) == (PER_CLIENT, 256 - PER_CLIENT)
            assert_refused(a.refused, "per client", f"max_streams_per_client {PER_CLIENT}", "ip:127.0.0.1")
            time.sleep(1.0)  # the other client keeps going meanwhile
            stop.set()
            checker.join(30)
            assert problems == [], problems[:5]
            assert all(call.is_active() for call in a.open)

            # Up to the cap in all: two more clients' streams fill it (40 = 16 + 16 + 8).
            c.add(PER_CLIENT)
            d.add(PER_CLIENT)
            assert (len(c.open), len(d.open), len(d.refused)) == (
                PER_CLIENT,
                IN_ALL - 2 * PER_CLIENT,
                3 * PER_CLIENT - IN_ALL,
            )
            assert_refused(d.refused, f"max_concurrent_streams {IN_ALL}")
            # Now every other call waits its turn, except health checks, which are never refused.
            with grpc.insecure_channel(address) as channel:
                with pytest.raises(grpc.RpcError) as err:
                    stub(channel).GetJob(gateway_pb2.GetJobRequest(job_id=fx.queued), timeout=10, metadata=key("b"))
                assert_refused([err.value], f"max_concurrent_streams {IN_ALL}")
            for _ in range(20):
                assert health_status(address) == health_pb2.HealthCheckResponse.SERVING

            # Streams count until they end: once D's are cancelled, B gets in again.
            d.close()

            def b_gets_in() -> bool:
                with grpc.insecure_channel(address) as channel:
                    try:
                        stub(channel).GetJob(gateway_pb2.GetJobRequest(job_id=fx.queued), timeout=10, metadata=key("b"))
                    except grpc.RpcError as exc:
                        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                        return False
                    return True

            eventually(b_gets_in, 20, "the cancelled streams' slots to be free")
        finally:
            stop.set()
            for w in (a, c, d):
                w.close()
    # All of A's slots come back too.
    with grpc.insecure_channel(address) as channel:
        again = eventually(lambda: (w := Watches(channel, fx.queued).add(1)).open and w, 20, "A's slots to be free")
        again.close()


def test_jobs_per_client_are_capped(fx: Fixture) -> None:
    address = fx.cluster.gateway_address
    audio = cut_wav((SAMPLES / "speech.wav").read_bytes(), 1.0)
    with LiplineClient(address, timeout=60, api_key="x") as x, LiplineClient(address, timeout=60, api_key="y") as y:
        avatar = x.create_avatar((SAMPLES / "avatar.jpg").read_bytes())
        jobs = [x.submit_job(avatar.id, audio) for _ in range(JOBS_PER_CLIENT)]
        assert {fx.store.get_job(j.id).owner for j in jobs} == {"key:x"}
        with pytest.raises(grpc.RpcError) as err:
            x.submit_job(avatar.id, audio)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "'key:x'" in err.value.details() and f"limit {JOBS_PER_CLIENT} for one client" in err.value.details()
        # Another client still gets its jobs queued; a cancelled job frees its owner's slot.
        other = y.submit_job(avatar.id, audio)
        assert fx.store.get_job(other.id).owner == "key:y"
        x.stub.CancelJob(gateway_pb2.CancelJobRequest(job_id=jobs[0].id), timeout=10)
        jobs.append(x.submit_job(avatar.id, audio))
        for job in [*jobs, other]:  # leave nothing queued for the tests after this one
            y.stub.CancelJob(gateway_pb2.CancelJobRequest(job_id=job.id), timeout=10)


def rss_bytes(pid: int) -> int:
    return int(rss_mb(pid) * 1024 * 1024)


def settled_rss(pid: int, seconds: float = 3.0) -> int:
    """The gateway's RSS once it has stopped growing (sampled for `seconds`), its peak meanwhile."""
    samples = []
    for _ in range(int(seconds / 0.1)):
        samples.append(rss_bytes(pid))
        time.sleep(0.1)
    return max(samples)


def test_downloads_nobody_reads_hold_little_memory(fx: Fixture) -> None:
    """8 clients open DownloadOutput on a 48 MiB output, take the first chunk and read no more: the
    gateway's memory stays bounded (chunks are read only as fast as they are sent): under
    STREAM_BUDGET per stream, where reading the outputs ahead would hold 8 x 48 MiB."""
    pid = fx.cluster.processes["gateway"].process.pid
    request = gateway_pb2.DownloadOutputRequest(job_id=fx.finished)
    with grpc.insecure_channel(fx.cluster.gateway_address) as channel:
        gateway = stub(channel)
        whole = b"".join(r.data for r in gateway.DownloadOutput(request, timeout=60, metadata=key("dl")))
        assert len(whole) == OUTPUT_BYTES  # warm: the download path has run once
        before = settled_rss(pid, 1.0)
        calls = [gateway.DownloadOutput(request, timeout=120, metadata=key(f"dl{i}")) for i in range(8)]
        try:
            firsts = [next(call) for call in calls]
            assert all(f.total_bytes == OUTPUT_BYTES and len(f.data) == 1 << 20 for f in firsts)
            growth = settled_rss(pid) - before
            print(f"gateway RSS growth with 8 unread downloads: {growth / MiB:.1f} MiB")
            assert growth < 8 * STREAM_BUDGET, (
                f"the gateway grew by {growth / MiB:.0f} MiB for 8 downloads nobody reads"
            )
            assert all(call.is_active() for call in calls)
        finally:
            for call in calls:
                call.cancel()
        # Chunks are 64 KiB..1 MiB whatever the client asks.
        for asked, size in [(1, 64 * 1024), (200_000, 200_000), (1 << 30, MiB)]:
            call = gateway.DownloadOutput(
                gateway_pb2.DownloadOutputRequest(job_id=fx.finished, chunk_bytes=asked), timeout=60
            )
            assert len(next(call).data) == size
            call.cancel()


def test_every_request_field_is_bounded(fx: Fixture) -> None:
    address = fx.cluster.gateway_address
    with grpc.insecure_channel(address) as channel:
        gateway = stub(channel)
        # Ids that cannot exist are NOT_FOUND (and never reach the store).
        for job_id in ["a" * 65, "\u0661\u0662\u0663", "abc/../x", "", "ab cd"]:
            for call in (
                lambda: gateway.GetJob(gateway_pb2.GetJobRequest(job_id=job_id), timeout=10),
                lambda: gateway.CancelJob(gateway_pb2.CancelJobRequest(job_id=job_id), timeout=10),
                lambda: list(gateway.WatchJob(gateway_pb2.WatchJobRequest(job_id=job_id), timeout=10)),
                lambda: list(gateway.DownloadOutput(gateway_pb2.DownloadOutputRequest(job_id=job_id), timeout=10)),
            ):
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert err.value.code() == grpc.StatusCode.NOT_FOUND, (job_id, err.value)
        with pytest.raises(grpc.RpcError) as err:
            gateway.GetAvatar(gateway_pb2.GetAvatarRequest(avatar_id="0" * 65), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        # An avatar name over 256 characters is refused at once, in whichever message it comes.
        for messages in (
            [gateway_pb2.CreateAvatarRequest(name="n" * 257)],
            [gateway_pb2.CreateAvatarRequest(data=b"x"), gateway_pb2.CreateAvatarRequest(name="n" * 257)],
        ):
            with pytest.raises(grpc.RpcError) as err:
                gateway.CreateAvatar(iter(messages), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "256" in err.value.details()

    # Options are stored as their known fields only: unknown fields sent along are dropped.
    with LiplineClient(address, timeout=60, api_key="fields") as client:
        avatar = client.create_avatar((SAMPLES / "avatar.jpg").read_bytes())
        options = gateway_pb2.JobOptions.FromString(
            gateway_pb2.JobOptions(crf=20).SerializeToString() + b"\xfa\x01\x05hello"
        )  # + field 31, unknown
        request = gateway_pb2.SubmitJobRequest(
            avatar_id=avatar.id, options=options, audio=cut_wav((SAMPLES / "speech.wav").read_bytes(), 0.5)
        )
        assert b"hello" in request.SerializeToString()
        job = client.stub.SubmitJob(request, timeout=60)
        assert fx.store.get_job(job.id).options == gateway_pb2.JobOptions(crf=20).SerializeToString()
        client.stub.CancelJob(gateway_pb2.CancelJobRequest(job_id=job.id), timeout=10)

    # A ListAvatars page holds at most 1000 avatars (newest first), with names of the longest kind;
    # the next page has the rest.
    now = time.time()
    for i in range(1001):
        fx.store.put_avatar(AvatarRecord(f"{i:024x}", "\U0001f600" * 256, 25.0, 1, 64, 64, 1, now + i))
    with LiplineClient(address, timeout=60, api_key="lister") as client:
        page = client.stub.ListAvatars(gateway_pb2.ListAvatarsRequest(page_size=5000), timeout=30)
        rest = client.stub.ListAvatars(
            gateway_pb2.ListAvatarsRequest(page_size=5000, page_token=page.next_page_token), timeout=30
        )
    listed = page.avatars
    assert len(listed) == 1000 and rest.avatars[0].id == f"{0:024x}"  # then the test's own, older avatars
    times = [a.create_time.ToNanoseconds() for a in listed]
    assert times == sorted(times, reverse=True)


def test_wait_survives_a_gateway_restart(fx: Fixture) -> None:
    """kill -9 the gateway while a client waits on a job, start it again on the same port: `wait`
    resumes (GetJob, then WatchJob) and returns the job's final state."""
    job_id = new_job(fx.store)
    events: list[int] = []
    first = threading.Event()
    result: dict[str, object] = {}

    def waiter() -> None:
        try:
            result["job"] = client.wait(job_id, lambda j: (events.append(j.state), first.set()))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            result["error"] = exc

    with LiplineClient(fx.cluster.gateway_address, timeout=120, api_key="w") as client:
        thread = threading.Thread(target=waiter)
        thread.start()
        assert first.wait(20)
        fx.cluster.kill("gateway")
        time.sleep(0.5)
        fx.cluster.restart("gateway")
        time.sleep(0.5)
        # The channel may still be in its reconnect back-off from the outage: wait for it, as a real caller would.
        client.stub.CancelJob(gateway_pb2.CancelJobRequest(job_id=job_id), timeout=30, wait_for_ready=True)
        thread.join(60)
    assert not thread.is_alive()
    assert "error" not in result, result.get("error")
    assert result["job"].state == gateway_pb2.JOB_STATE_CANCELLED
    assert events[0] == gateway_pb2.JOB_STATE_QUEUED and events[-1] == gateway_pb2.JOB_STATE_CANCELLED
