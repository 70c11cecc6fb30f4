"""Long jobs with real processes on 127.0.0.1 (issue 17, items 2, 6 and 7), on SQLite and PostgreSQL:
a long job does not starve a short one submitted after it (fair claims), a WatchJob of a job longer
than the gateway's connection age delivers until the job ends, and an output damaged in the blob
store is never served as complete (DATA_LOSS).

The cluster: one gateway whose connections age after 2 s with a drain time (grace_s) of 1 s (so
the old connection-age grace, max(grace_s, 1 s), would cut a stream after about 3 s), two render
workers, 1 s segments. Clients are told apart by their x-api-key metadata (no key file: the value
is the client's identity, and the job's owner).
"""

from __future__ import annotations

import hashlib
import io
import threading
import time
import wave
from collections.abc import Iterator

import cv2
import grpc
import pytest

from lipline.v1 import gateway_pb2, gateway_pb2_grpc
from services.gateway.client import LiplineClient
from services.jobs.layout import output_key
from services.local.cluster import LocalCluster
from tests.integration.util import SAMPLES, eventually, start_cluster

CONNECTION_AGE_S, GRACE_S = 2.0, 1.0
OLD_STREAM_LIMIT_S = CONNECTION_AGE_S + max(GRACE_S, 1.0)  # what cut a stream before issue 17


def speech(seconds: float) -> bytes:
    """`seconds` of samples/speech.wav, looped (it is 7.7 s long), as a WAV file."""
    with wave.open(str(SAMPLES / "speech.wav")) as src:
        params, frames = src.getparams(), src.readframes(src.getnframes())
    want = round(seconds * params.framerate) * params.sampwidth * params.nchannels
    out = io.BytesIO()
    with wave.open(out, "wb") as dst:
        dst.setparams(params)
        dst.writeframes((frames * (want // len(frames) + 1))[:want])
    return out.getvalue()


@pytest.fixture(scope="module")
def long_cluster(job_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    gateway = ["--segment-seconds=1.0", f"--max-connection-age-s={CONNECTION_AGE_S}", f"--grace-s={GRACE_S}"]
    render = ["--poll-s=0.05"]
    with start_cluster(
        tmp_path_factory.mktemp("long"), job_store=job_store_url, extra_args={"gateway": gateway, "render": render}
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def small_avatar(long_cluster: LocalCluster) -> gateway_pb2.Avatar:
    """The sample face at 256x256: cheap frames, so segment times are short on a small CPU."""
    face = cv2.resize(cv2.imread(str(SAMPLES / "avatar.jpg")), (256, 256), interpolation=cv2.INTER_AREA)
    ok, jpeg = cv2.imencode(".jpg", face)
    assert ok
    with LiplineClient(long_cluster.gateway_address, timeout=120) as client:
        return client.create_avatar(jpeg.tobytes(), name="small")


def client_of(cluster: LocalCluster, name: str) -> LiplineClient:
    return LiplineClient(cluster.gateway_address, timeout=600, api_key=name)


def test_a_short_job_submitted_after_a_long_one_is_not_queued_behind_it(
    long_cluster: LocalCluster, small_avatar: gateway_pb2.Avatar
) -> None:
    with client_of(long_cluster, "alice") as alice, client_of(long_cluster, "bob") as bob:
        long_job = alice.submit_job(small_avatar.id, speech(30.0))
        assert long_job.total_frames == 750  # 30 segments of 25 frames
        eventually(
            lambda: alice.stub.GetJob(gateway_pb2.GetJobRequest(job_id=long_job.id), timeout=30).frames_done >= 25,
            timeout=120,
            what="the long job's first segment",
        )
        short = bob.submit_job(small_avatar.id, speech(5.0))
        done = bob.wait(short.id)
        long_now = alice.stub.GetJob(gateway_pb2.GetJobRequest(job_id=long_job.id), timeout=30)
        alice.stub.CancelJob(gateway_pb2.CancelJobRequest(job_id=long_job.id), timeout=30)
    assert done.state == gateway_pb2.JOB_STATE_SUCCEEDED, done.error
    # Claimed in job order (before issue 17), the short job's tasks came after every segment of the
    # long one: it finished with the long job's segments all done. Fair claims give it a worker as
    # soon as one frees up: the two jobs share the two workers.
    frames_left = long_now.total_frames - long_now.frames_done
    assert frames_left >= 10 * 25, f"the short job finished when the long one had only {frames_left} frames left"


def test_watchjob_outlives_the_connection_age(long_cluster: LocalCluster, small_avatar: gateway_pb2.Avatar) -> None:
    """A raw WatchJob stream (not LiplineClient.wait, which resumes) open for longer than the
    connection age plus the old grace delivers every event until the job ends (here: cancelled,
    2 s after the old limit, so the test does not depend on how fast this machine renders)."""
    cancel_after = OLD_STREAM_LIMIT_S + 2.0
    with client_of(long_cluster, "carol") as carol:
        job = carol.submit_job(small_avatar.id, speech(300.0))
        cancel = threading.Timer(
            cancel_after, lambda: carol.stub.CancelJob(gateway_pb2.CancelJobRequest(job_id=job.id), timeout=30)
        )
        events: list[gateway_pb2.Job] = []
        with grpc.insecure_channel(long_cluster.gateway_address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            opened = time.monotonic()
            cancel.start()
            try:
                for event in stub.WatchJob(
                    gateway_pb2.WatchJobRequest(job_id=job.id), timeout=600, metadata=(("x-api-key", "carol"),)
                ):
                    events.append(event.job)
            except grpc.RpcError as exc:
                pytest.fail(
                    f"WatchJob was cut after {time.monotonic() - opened:.1f} s: {exc.code().name} {exc.details()}"
                )
            finally:
                cancel.cancel()  # not yet fired (the stream failed): never; fired: wait for its answer
                cancel.join()
            lasted = time.monotonic() - opened
    assert events, "no events"
    assert events[-1].state == gateway_pb2.JOB_STATE_CANCELLED, (
        f"the job ended {events[-1].state} before the test could cancel it: render a longer one"
    )
    assert lasted >= cancel_after
    assert len(events) >= 2 and any(e.frames_done for e in events)  # progress kept coming on the aged connection


def test_a_damaged_output_ends_the_download_with_data_loss(
    long_cluster: LocalCluster, small_avatar: gateway_pb2.Avatar
) -> None:
    with client_of(long_cluster, "dave") as dave:
        job = dave.wait(dave.submit_job(small_avatar.id, speech(2.0)).id)
        assert job.state == gateway_pb2.JOB_STATE_SUCCEEDED, job.error

        def download() -> tuple[bytes, grpc.RpcError | None]:
            got = []
            try:
                for response in dave.stub.DownloadOutput(
                    gateway_pb2.DownloadOutputRequest(job_id=job.id, chunk_bytes=64 * 1024), timeout=60
                ):
                    got.append(response.data)
            except grpc.RpcError as exc:
                return b"".join(got), exc
            return b"".join(got), None

        whole, error = download()
        assert error is None and len(whole) == job.output_bytes
        assert job.output_sha256 == hashlib.sha256(whole).hexdigest()  # clients can check it too
        path = long_cluster.blob_dir / output_key(job.id)
        assert path.read_bytes() == whole

        # Truncated: refused before the first byte, naming both sizes.
        path.write_bytes(whole[: len(whole) // 2])
        got, error = download()
        assert error is not None and error.code() == grpc.StatusCode.DATA_LOSS, error
        assert got == b""
        assert f"{len(whole) // 2} of {len(whole)} bytes" in error.details() and job.id in error.details()

        # Same size, other bytes: the stream ends DATA_LOSS after the last chunk.
        middle = len(whole) // 2
        path.write_bytes(whole[:middle] + bytes(b ^ 0xFF for b in whole[middle : middle + 16]) + whole[middle + 16 :])
        got, error = download()
        assert error is not None and error.code() == grpc.StatusCode.DATA_LOSS, error
        assert "checksum mismatch" in error.details()
        assert len(got) == len(whole)

        # Missing: DATA_LOSS too (the job says SUCCEEDED; its output is gone).
        path.unlink()
        _, error = download()
        assert error is not None and error.code() == grpc.StatusCode.DATA_LOSS, error

        path.write_bytes(whole)  # repaired: served whole again
        assert download() == (whole, None)
        assert (
            dave.stub.GetJob(gateway_pb2.GetJobRequest(job_id=job.id), timeout=30).state
            == gateway_pb2.JOB_STATE_SUCCEEDED
        )
