"""Retention through real processes (issue 21 item 6), on the SQLite and on the PostgreSQL job store:
outputs expire after the TTL (2 s here) and the render workers' janitor deletes them, the job says
so and DownloadOutput and GetOutputUrl refuse it; working files an ended job left behind are
deleted; one janitor at a time across two render workers, and another takes over once a killed
holder's lease expires.

One cluster with two render workers whose janitor runs every 0.3 s on a 3 s lease; the kill comes
last (the module's cluster keeps one worker after it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from lipline.v1 import gateway_pb2
from services.gateway.client import LiplineClient
from services.jobs.store import open_job_store
from services.jobs.store.jobs import JobStore, NewJob
from services.local.cluster import LocalCluster
from services.render.janitor import JANITOR_LEASE
from tests.integration.util import SAMPLES, cut_wav, eventually, start_cluster

TTL_S = 2.0
JANITOR = ["--janitor-interval-s=0.3", "--janitor-lease-s=3", "--lease-s=4", f"--output-ttl-s={TTL_S:g}"]


@dataclass
class Retention:
    cluster: LocalCluster
    store: JobStore
    client: LiplineClient
    avatar: gateway_pb2.Avatar


@pytest.fixture(scope="module")
def env(job_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Retention]:
    workdir = tmp_path_factory.mktemp("retention")
    extra = {"gateway": ["--segment-seconds=0.4", f"--output-ttl-s={TTL_S:g}"], "render": JANITOR}
    with start_cluster(workdir / "cluster", job_store=job_store_url, extra_args=extra, replicas={"render": 2}) as c:
        store = open_job_store(job_store_url)
        client = LiplineClient(c.gateway_address, timeout=120)
        try:
            avatar = client.create_avatar((SAMPLES / "avatar.jpg").read_bytes(), name="retention")
            yield Retention(c, store, client, avatar)
        finally:
            client.close()
            store.close()


def refusal(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    return caught.value.code(), caught.value.details()


def test_after_the_ttl_the_janitor_deletes_the_output_and_the_job_says_it_expired(env: Retention) -> None:
    blobs = env.cluster.blob_dir
    job = env.client.submit_job(env.avatar.id, cut_wav((SAMPLES / "speech.wav").read_bytes(), 0.4))
    done = env.client.wait(job.id)
    assert done.state == gateway_pb2.JOB_STATE_SUCCEEDED, done.error
    stored = env.store.get_job(job.id)
    assert abs(stored.output_expire_time - stored.finish_time - TTL_S) < 0.5  # stamped by the join
    assert done.HasField("output_expire_time")
    assert abs(done.output_expire_time.ToNanoseconds() / 1e9 - stored.output_expire_time) < 1e-3

    eventually(lambda: not (blobs / "outputs" / f"{job.id}.mp4").exists(), 20, "the janitor to delete the output")
    # It marks the job once the blob is gone (a janitor stopped in between leaves it to the next sweep).
    eventually(lambda: env.store.get_job(job.id).output_purge_time > 0, 10, "the janitor to mark the output purged")
    assert not (blobs / "jobs" / job.id).exists()  # the working files went when the job ended
    shown = env.client.get_job(job.id)
    assert shown.output_expired and shown.state == gateway_pb2.JOB_STATE_SUCCEEDED
    for call in (
        lambda: list(env.client.stub.DownloadOutput(gateway_pb2.DownloadOutputRequest(job_id=job.id))),
        lambda: env.client.stub.GetOutputUrl(gateway_pb2.GetOutputUrlRequest(job_id=job.id)),
    ):
        code, details = refusal(call)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith("output expired at 20"), details
    listed = env.client.stub.ListJobs(gateway_pb2.ListJobsRequest(page_size=10)).jobs
    assert [j.output_expired for j in listed if j.id == job.id] == [True]
    env.client.stub.DeleteJob(gateway_pb2.DeleteJobRequest(job_id=job.id))  # an expired job still deletes
    assert refusal(lambda: env.client.get_job(job.id))[0] == grpc.StatusCode.NOT_FOUND


def test_working_files_an_ended_job_left_behind_are_deleted(env: Retention) -> None:
    """A job that ended while its delete was lost (a worker killed between the two): its row is
    written here as that worker left it, its files as they were."""
    blobs = env.cluster.blob_dir
    job_id = "left-behind-0123456789ab"
    env.store.create_job(NewJob(job_id, env.avatar.id, "o", b"", 0.4, 25.0, 10, [(0, 10)]))
    env.store.fail_job(job_id, "the worker was killed", grpc.StatusCode.ABORTED.value[0])
    for name in ("upload", "mels/00001.f16", "segments/00001.mp4"):
        (blobs / "jobs" / job_id / name).parent.mkdir(parents=True, exist_ok=True)
        (blobs / "jobs" / job_id / name).write_bytes(b"x")
    eventually(lambda: not files_under(blobs / "jobs" / job_id), 20, "the janitor to delete the files")


def files_under(folder: Path) -> list[Path]:
    """The files left in `folder`; none once it is gone (the janitor may delete it mid-walk)."""
    try:
        return [p for p in folder.rglob("*") if p.is_file()]
    except FileNotFoundError:
        return []


def holder(env: Retention) -> str:
    return env.store.lease_holder(JANITOR_LEASE)


def render_pid(name: str) -> int:
    """The process id in a render worker's name (host:pid:random)."""
    return int(name.split(":")[1])


def test_one_janitor_at_a_time_and_another_takes_over_when_the_holder_is_killed(env: Retention) -> None:
    workers = {env.cluster.processes[n].process.pid: n for n in env.cluster.replica_names("render")}
    first = eventually(lambda: holder(env), 10, "a janitor to take the lease")
    assert render_pid(first) in workers
    seen = set()
    for _ in range(8):  # several rounds (0.3 s each): the holder keeps it
        seen.add(holder(env))
        time.sleep(0.25)
    assert seen == {first}

    env.cluster.kill(workers[render_pid(first)])
    second = eventually(lambda: (h := holder(env)) and h != first and h, 15, "the other worker to take the lease")
    assert render_pid(second) in workers and render_pid(second) != render_pid(first)
    # and it sweeps: a leftover appears, the new janitor removes it
    blobs = env.cluster.blob_dir
    job_id = "after-takeover-0123456789"
    env.store.create_job(NewJob(job_id, env.avatar.id, "o", b"", 0.4, 25.0, 10, [(0, 10)]))
    env.store.cancel_job(job_id)
    (blobs / "jobs" / job_id).mkdir(parents=True, exist_ok=True)
    (blobs / "jobs" / job_id / "upload").write_bytes(b"x")
    eventually(lambda: not (blobs / "jobs" / job_id / "upload").exists(), 20, "the new janitor to sweep")
