"""Stage replicas that go away politely never fail a job: SIGTERM drains, connection ages expire.

A stage on SIGTERM goes NOT_SERVING, finishes the streams it has accepted and ends; a stream still
running when its grace is over ends with a status the render worker retries elsewhere. With
`max_connection_age` the stages close every connection after a while so that clients rebalance; a
stream on a closing connection finishes within the age's grace, and a new one goes to a new
connection. Either way the job succeeds with every frame once and in order (the numbered template of
test_render_workers: each output frame carries its source frame's index).

The cluster: 2 lipsync and 2 superres replicas, 2 render workers with short leases, 1 s segments.
"""

from __future__ import annotations

import io
import re
import threading
import time
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest

from lipline.v1 import gateway_pb2
from services.gateway.client import LiplineClient
from services.local.cluster import LocalCluster
from tests.integration.test_render_workers import assert_every_frame_in_order, numbered_avatar
from tests.integration.util import SAMPLES, eventually, start_cluster

WORKER = ["--lease-s=2", "--heartbeat-s=0.25", "--poll-s=0.05", "--max-attempts=4"]
REPLICAS = {"lipsync": 2, "superres": 2, "render": 2}
JOB_S = 4  # seconds of speech per job: 4 segments, each rendered over more than one connection age on a CPU
AGE_TEST_S = 8.0  # how long the connection-age test keeps jobs running (1 s ages + 1 s grace: 4+ generations)


def speech(seconds: float) -> bytes:
    """`seconds` of the sample speech (repeated when longer than the sample), as a PCM WAV."""
    with wave.open(str(SAMPLES / "speech.wav")) as src:
        params = src.getparams()
        pcm = src.readframes(params.nframes)
    frame_bytes = params.sampwidth * params.nchannels
    want = round(seconds * params.framerate) * frame_bytes
    data = (pcm * (want // len(pcm) + 1))[:want]
    out = io.BytesIO()
    with wave.open(out, "wb") as dst:
        dst.setparams(params)
        dst.writeframes(data)
    return out.getvalue()


@pytest.fixture(scope="module")
def dcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    extra_args = {"gateway": ["--segment-seconds=1"], "render": WORKER}
    with start_cluster(tmp_path_factory.mktemp("drain"), replicas=REPLICAS, extra_args=extra_args) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def numbered(dcluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> gateway_pb2.Avatar:
    return numbered_avatar(dcluster, tmp_path_factory.mktemp("template"))


@pytest.fixture
def client(dcluster: LocalCluster) -> Iterator[LiplineClient]:
    with LiplineClient(dcluster.gateway_address, timeout=180) as c:
        yield c


def _job(client: LiplineClient, job_id: str) -> gateway_pb2.Job:
    return client.stub.GetJob(gateway_pb2.GetJobRequest(job_id=job_id), timeout=10)


def inflight_items(cluster: LocalCluster, name: str) -> float:
    """The stage's lipline_stage_inflight_items gauge (items accepted and not yet answered), from /metrics."""
    port = cluster.processes[name].metrics_port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    match = re.search(r"^lipline_stage_inflight_items\{[^}]*\} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize("stage", ["lipsync", "superres"])
def test_stage_replica_sigterm_mid_job(
    dcluster: LocalCluster, numbered: gateway_pb2.Avatar, client: LiplineClient, tmp_path: Path, stage: str
) -> None:
    name = f"{stage}-1"
    job = client.submit_job(numbered.id, speech(7.5), super_resolution=True)
    try:
        # SIGTERM while the replica holds accepted items (a stream mid-flight), or, if the polling never
        # sees one, once a first segment is done: either way mid-job.
        def busy() -> bool:
            j = _job(client, job.id)
            assert j.state in (gateway_pb2.JOB_STATE_QUEUED, gateway_pb2.JOB_STATE_RUNNING), j
            return inflight_items(dcluster, name) > 0 or j.frames_done >= j.total_frames // 2

        eventually(busy, every=0.005, what=f"{name} to hold items")
        caught = inflight_items(dcluster, name)
        assert dcluster.terminate(name) == 0, dcluster.processes[name].log()[-3000:]  # drains, then exits 0
        assert "draining in-flight RPCs" in dcluster.processes[name].log()
        assert_every_frame_in_order(client, job, tmp_path)
        retried = sum(
            dcluster.processes[n].log().count("task given back for another attempt")
            for n in dcluster.replica_names("render")
        )
        print(f"{name}: SIGTERM with {caught:.0f} items in flight; {retried} segment retries in all")
    finally:
        if dcluster.processes[name].process.poll() is not None:
            dcluster.restart(name)


def test_connection_age_expiry_mid_job(dcluster: LocalCluster, numbered: gateway_pb2.Avatar, tmp_path: Path) -> None:
    """Stages close every connection after 1 s (1 s grace): two 4 s jobs at once outlive many connections.

    The template avatar was registered with the default ages: CreateAvatar's DetectFaces is one
    stream over the whole avatar (200 frames here), which a 1 s age cuts (that is the gateway's call,
    not a render stream). Then every stage replica is restarted, one at a time, with the short ages,
    which they keep for the rest of the module: jobs must not notice them.
    """
    cluster, avatar = dcluster, numbered
    for stage in ("audio", "lipsync", "superres"):
        for name in cluster.replica_names(stage):
            assert cluster.terminate(name) == 0
            cluster.processes[name].args.extend(["--max-connection-age-s=1", "--grace-s=1"])
            cluster.restart(name)
    with LiplineClient(cluster.gateway_address, timeout=180) as client:
        # Pairs of 4 s jobs back to back for at least AGE_TEST_S: whatever the machine's speed,
        # the render streams run over several generations of connections.
        started, rounds = time.monotonic(), 0
        while rounds == 0 or time.monotonic() - started < AGE_TEST_S:
            jobs = [client.submit_job(avatar.id, speech(JOB_S), super_resolution=sr) for sr in (True, False)]
            results: dict[str, gateway_pb2.Job] = {}
            threads = [threading.Thread(target=lambda j=j: results.__setitem__(j.id, client.wait(j.id))) for j in jobs]
            for t in threads:
                t.start()
            for t in threads:
                t.join(200)
            for k, job in enumerate(jobs):
                done = results[job.id]
                assert done.state == gateway_pb2.JOB_STATE_SUCCEEDED, done.error
                assert done.total_frames == JOB_S * 25
                out = tmp_path / f"{rounds}-{k}"
                out.mkdir()
                assert_every_frame_in_order(client, job, out)
            rounds += 1
    retried = sum(
        cluster.processes[n].log().count("task given back for another attempt") for n in cluster.replica_names("render")
    )
    print(
        f"{2 * rounds} jobs of {JOB_S:g} s in {time.monotonic() - started:.1f} s with 1 s connection ages; {retried} segment retries"
    )
