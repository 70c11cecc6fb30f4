"""The render system under failure, with real processes on 127.0.0.1, on SQLite and on PostgreSQL.

Every job here renders a template video whose frames carry their own index (two grey blocks in a
corner, far from the face), so an output can be checked frame by frame: every frame once, in order.
The cluster has two gateways, two render workers and two replicas of each GPU stage, so a test can
kill one of anything and expect the job to finish; each test brings what it killed back.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import av
import cv2
import grpc
import numpy as np
import pytest

from lipline.v1 import gateway_pb2
from services.gateway.client import LiplineClient
from services.local.cluster import LocalCluster
from services.render.mp4 import Mp4Writer
from tests.helpers.postgres import PostgresServer, missing_reason
from tests.integration.util import SAMPLES, eventually, rss_mb

FPS = 25
TEMPLATE_FRAMES = 200
SEGMENT_S = 1.0
BLOCK = 24


def marker_template(path: Path) -> None:
    """A 256x256 video of the sample face; frame i carries i in two grey blocks at the bottom left."""
    face = cv2.resize(cv2.imread(str(SAMPLES / "avatar.jpg")), (256, 256), interpolation=cv2.INTER_AREA)
    with Mp4Writer(path, 256, 256, FPS, None, 16_000, crf=10) as writer:
        for i in range(TEMPLATE_FRAMES):
            frame = face.copy()
            frame[-BLOCK:, :BLOCK] = (i % 16) * 16 + 8
            frame[-BLOCK:, BLOCK : 2 * BLOCK] = (i // 16) * 16 + 8
            writer.write(frame)


def frame_indices(data: bytes, tmp_path: Path) -> list[int]:
    """The index each output frame carries (see marker_template)."""
    path = tmp_path / "out.mp4"
    path.write_bytes(data)
    out = []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            image = frame.to_ndarray(format="gray")
            lo = image[-BLOCK + 4 : -4, 4 : BLOCK - 4].mean()
            hi = image[-BLOCK + 4 : -4, BLOCK + 4 : 2 * BLOCK - 4].mean()
            out.append(int(round((hi - 8) / 16)) * 16 + int(round((lo - 8) / 16)))
    return out


def download(client: LiplineClient, job_id: str) -> bytes:
    return b"".join(
        r.data for r in client.stub.DownloadOutput(gateway_pb2.DownloadOutputRequest(job_id=job_id), timeout=60)
    )


def speech_seconds(seconds: float) -> bytes:
    from tests.integration.util import cut_wav

    return cut_wav((SAMPLES / "speech.wav").read_bytes(), seconds)


def render_busy(cluster: LocalCluster, name: str) -> float:
    """The worker's lipline_render_busy gauge, read from its /metrics."""
    import urllib.request

    port = cluster.processes[name].metrics_port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    match = re.search(r"^lipline_render_busy (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, PostgresServer | None]]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'jobs.db'}", None
        return
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    with PostgresServer() as server:
        yield server.url, server


@pytest.fixture(scope="module")
def rcluster(
    store_url: tuple[str, PostgresServer | None], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    url, _ = store_url
    # A 15 s retry window (60 s by default) keeps the give-up test short; a PostgreSQL restart fits in it.
    worker = ["--lease-s=2", "--heartbeat-s=0.25", "--poll-s=0.05", "--max-attempts=4", "--retry-window-s=15"]
    with LocalCluster(
        tmp_path_factory.mktemp("render"),
        job_store=url,
        replicas={"gateway": 2, "render": 2, "lipsync": 2, "superres": 2},
        extra_args={"gateway": [f"--segment-seconds={SEGMENT_S}"], "render": worker},
    ) as cluster:
        yield cluster


def numbered_avatar(cluster: LocalCluster, folder: Path) -> gateway_pb2.Avatar:
    """The marker template (frames that carry their index) registered as an avatar, a face in every frame."""
    path = folder / "template.mp4"
    marker_template(path)
    with LiplineClient(cluster.gateway_address, timeout=120) as client:
        avatar = client.create_avatar(path.read_bytes(), name="numbered")
    assert avatar.frame_count == TEMPLATE_FRAMES and avatar.faces_found == TEMPLATE_FRAMES
    return avatar


@pytest.fixture(scope="module")
def template(rcluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> gateway_pb2.Avatar:
    return numbered_avatar(rcluster, tmp_path_factory.mktemp("template"))


@pytest.fixture
def client(rcluster: LocalCluster) -> Iterator[LiplineClient]:
    with LiplineClient(rcluster.gateway_address, timeout=120) as c:
        yield c


@pytest.fixture(autouse=True)
def everything_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, restart whatever it killed, so the next test starts from a full cluster."""
    yield
    if "rcluster" not in request.fixturenames:
        return
    cluster: LocalCluster = request.getfixturevalue("rcluster")
    for name, proc in cluster.processes.items():
        if proc.process.poll() is not None:
            cluster.restart(name)


def wait_claimed(cluster: LocalCluster, name: str, job_id: str, timeout: float = 60) -> None:
    eventually(
        lambda: (
            f'"job_id": "{job_id}"' in cluster.processes[name].log() and "task claimed" in cluster.processes[name].log()
        ),
        timeout=timeout,
        every=0.02,
        what=f"{name} to claim a task of {job_id}",
    )


def assert_every_frame_in_order(client: LiplineClient, job: gateway_pb2.Job, tmp_path: Path) -> None:
    done = client.wait(job.id)
    assert done.state == gateway_pb2.JOB_STATE_SUCCEEDED, done.error
    indices = frame_indices(download(client, job.id), tmp_path)
    assert len(indices) == done.total_frames
    assert indices == [i % TEMPLATE_FRAMES for i in range(done.total_frames)]


def test_worker_killed_mid_segment(
    rcluster: LocalCluster, template: gateway_pb2.Avatar, client: LiplineClient, tmp_path: Path
) -> None:
    job = client.submit_job(template.id, speech_seconds(6.0))
    wait_claimed(rcluster, "render-1", job.id)
    rcluster.kill("render-1")  # mid-segment: no drain, its lease simply stops being renewed
    assert_every_frame_in_order(client, job, tmp_path)


@pytest.mark.parametrize("stage", ["lipsync", "superres"])
def test_stage_replica_killed_mid_job(
    rcluster: LocalCluster, template: gateway_pb2.Avatar, client: LiplineClient, tmp_path: Path, stage: str
) -> None:
    job = client.submit_job(template.id, speech_seconds(6.0), super_resolution=True)
    eventually(
        lambda: client.stub.GetJob(gateway_pb2.GetJobRequest(job_id=job.id)).state == gateway_pb2.JOB_STATE_RUNNING,
        every=0.02,
        what="the job to start",
    )
    rcluster.kill(f"{stage}-1")
    assert_every_frame_in_order(client, job, tmp_path)


def test_cancel_mid_job_stops_every_worker_and_leaves_nothing(
    rcluster: LocalCluster, template: gateway_pb2.Avatar, client: LiplineClient
) -> None:
    job = client.submit_job(template.id, speech_seconds(7.5))
    eventually(
        lambda: client.stub.GetJob(gateway_pb2.GetJobRequest(job_id=job.id)).frames_done > 0,
        every=0.02,
        what="a first segment",
    )
    cancelled = client.stub.CancelJob(gateway_pb2.CancelJobRequest(job_id=job.id), timeout=10)
    assert cancelled.state == gateway_pb2.JOB_STATE_CANCELLED
    assert cancelled.error_code == grpc.StatusCode.CANCELLED.value[0]
    time.sleep(1.0)
    assert [render_busy(rcluster, n) for n in rcluster.replica_names("render")] == [0.0, 0.0]
    job_blobs = rcluster.blob_dir / "jobs" / job.id
    eventually(
        lambda: not job_blobs.exists() or not any(job_blobs.rglob("*")),
        timeout=30,
        what="the job's blobs to be removed",
    )
    assert not (rcluster.blob_dir / "outputs" / f"{job.id}.mp4").exists()
    assert client.stub.GetJob(gateway_pb2.GetJobRequest(job_id=job.id)).state == gateway_pb2.JOB_STATE_CANCELLED


def test_gateway_killed_and_restarted(rcluster: LocalCluster, template: gateway_pb2.Avatar, tmp_path: Path) -> None:
    address = rcluster.gateway_address
    with LiplineClient(address, timeout=120) as client:
        job = client.submit_job(template.id, speech_seconds(6.0))
    rcluster.kill("gateway")
    rcluster.restart("gateway")  # same port: the same address works again
    with LiplineClient(address, timeout=120) as client:
        events = [e.job for e in client.stub.WatchJob(gateway_pb2.WatchJobRequest(job_id=job.id), timeout=120)]
        assert events[-1].state == gateway_pb2.JOB_STATE_SUCCEEDED, events[-1].error
        assert client.stub.GetJob(gateway_pb2.GetJobRequest(job_id=job.id)).state == gateway_pb2.JOB_STATE_SUCCEEDED
        assert_every_frame_in_order(client, job, tmp_path)


def test_two_gateways_answer_for_each_other(rcluster: LocalCluster, tmp_path: Path, avatar_bytes: bytes) -> None:
    one, two = (LiplineClient(a, timeout=120) for a in rcluster.gateway_addresses)
    with one, two:
        avatar = one.create_avatar(avatar_bytes, name="shared")
        assert two.stub.GetAvatar(gateway_pb2.GetAvatarRequest(avatar_id=avatar.id)).id == avatar.id
        job = two.submit_job(avatar.id, speech_seconds(4.0))
        seen: dict[str, list[gateway_pb2.Job]] = {"one": [], "two": []}

        def watch(name: str, c: LiplineClient) -> None:
            seen[name] = [e.job for e in c.stub.WatchJob(gateway_pb2.WatchJobRequest(job_id=job.id), timeout=120)]

        threads = [threading.Thread(target=watch, args=item) for item in (("one", one), ("two", two))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(130)
        for name, events in seen.items():
            assert events and events[-1].state == gateway_pb2.JOB_STATE_SUCCEEDED, (name, events[-1:])
            progress = [e.progress for e in events]
            assert progress == sorted(progress), (name, progress)
        assert len(download(one, job.id)) == len(download(two, job.id)) > 0


def test_postgres_restart_mid_job(
    rcluster: LocalCluster,
    store_url: tuple[str, PostgresServer | None],
    template: gateway_pb2.Avatar,
    client: LiplineClient,
    tmp_path: Path,
) -> None:
    _, server = store_url
    if server is None:
        pytest.skip("PostgreSQL only: SQLite is a file, there is no server to restart")
    job = client.submit_job(template.id, speech_seconds(6.0))
    wait_claimed(rcluster, "render", job.id)
    started = time.monotonic()
    server.restart()
    done = eventually(lambda: _terminal(client, job.id), timeout=90, every=0.5, what="the job to end after the restart")
    assert time.monotonic() - started < 90
    if done.state == gateway_pb2.JOB_STATE_SUCCEEDED:
        assert_every_frame_in_order(client, job, tmp_path)
    else:
        assert done.state == gateway_pb2.JOB_STATE_FAILED and done.error, done


def _terminal(client: LiplineClient, job_id: str) -> gateway_pb2.Job | None:
    try:
        job = client.stub.GetJob(gateway_pb2.GetJobRequest(job_id=job_id), timeout=10)
    except grpc.RpcError:
        return None  # the gateway's store is still reconnecting
    return (
        job
        if job.state in (gateway_pb2.JOB_STATE_SUCCEEDED, gateway_pb2.JOB_STATE_FAILED, gateway_pb2.JOB_STATE_CANCELLED)
        else None
    )


@pytest.mark.slow
def test_sixteen_concurrent_jobs_and_a_light_gateway(
    rcluster: LocalCluster, template: gateway_pb2.Avatar, client: LiplineClient
) -> None:
    audio = speech_seconds(3.0)
    jobs = [client.submit_job(template.id, audio) for _ in range(16)]
    peak = 0.0
    pid = rcluster.processes["gateway"].process.pid
    for job in jobs:
        done = client.wait(job.id)
        assert done.state == gateway_pb2.JOB_STATE_SUCCEEDED, done.error
        peak = max(peak, rss_mb(pid))
    print(f"gateway peak RSS with 16 concurrent jobs: {peak:.0f} MB")
    assert peak < 300, f"gateway resident memory {peak:.0f} MB"


def long_speech(seconds: float) -> bytes:
    """`seconds` of 16 kHz mono speech: the sample repeated (a small upload for a long clip)."""
    from services.media.audio import decode_audio
    from tests.helpers.audio_files import pcm_wav

    pcm = decode_audio((SAMPLES / "speech.wav").read_bytes(), 16_000)
    reps = int(np.ceil(seconds * 16_000 / len(pcm)))
    return pcm_wav(np.tile(pcm, reps)[: int(seconds * 16_000)], 16_000)


@pytest.mark.slow
def test_a_long_clip_keeps_worker_memory_flat(
    rcluster: LocalCluster, store_url: tuple[str, PostgresServer | None], client: LiplineClient
) -> None:
    if store_url[1] is not None:
        pytest.skip("one store is enough for a memory test (the SQLite run covers it)")
    photo = cv2.resize(cv2.imread(str(SAMPLES / "avatar.jpg")), (256, 256), interpolation=cv2.INTER_AREA)
    ok, jpeg = cv2.imencode(".jpg", photo)
    avatar = client.create_avatar(jpeg.tobytes(), name="small")
    # Three minutes (the 10-minute run took 194 s of CI's 2 cores): 18 segments of the same work, enough
    # for a per-segment leak to show; bench/bench_e2e.py renders the long clips.
    job = client.submit_job(avatar.id, long_speech(180.0))
    assert job.total_frames == 4_500
    pids = {name: rcluster.processes[name].process.pid for name in rcluster.replica_names("render")}
    samples: dict[str, list[tuple[int, float]]] = {name: [] for name in pids}
    while True:
        now = client.stub.GetJob(gateway_pb2.GetJobRequest(job_id=job.id), timeout=10)
        for name, pid in pids.items():
            samples[name].append((now.frames_done, rss_mb(pid)))
        if now.state != gateway_pb2.JOB_STATE_RUNNING and now.state != gateway_pb2.JOB_STATE_QUEUED:
            break
        time.sleep(0.25)
    assert now.state == gateway_pb2.JOB_STATE_SUCCEEDED, now.error
    for name, series in samples.items():
        # From the first tenth of the clip on (the avatar is cached, the encoder warm) to the end.
        settled = [rss for done, rss in series if done >= 450]
        assert settled, series[:5]
        growth = max(settled) - settled[0]
        assert growth < 60, (
            f"{name} grew by {growth:.0f} MB over a 3-minute clip ({settled[0]:.0f} -> {max(settled):.0f} MB)"
        )


def test_a_stage_failure_fails_the_job_with_the_stages_status(
    rcluster: LocalCluster, template: gateway_pb2.Avatar, client: LiplineClient
) -> None:
    # Both lipsync replicas gone for good: every attempt of the first segment fails with UNAVAILABLE
    # until the attempts run out. The job must end FAILED with that status, never CANCELLED.
    for name in rcluster.replica_names("lipsync"):
        rcluster.kill(name)
    job = client.submit_job(template.id, speech_seconds(2.0))
    done = client.wait(job.id)
    assert done.state == gateway_pb2.JOB_STATE_FAILED, done
    assert done.error_code == grpc.StatusCode.UNAVAILABLE.value[0], done
    assert "lipsync stage failed" in done.error and "attempt" in done.error, done.error
