"""SubmitJob's work without its protos (services.gateway.submit.submit_job), on a temporary SQLite job
store and folder blob store, with the real audio stage in-process on 127.0.0.1 (its extraction in a
thread: no child processes)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from lipline.v1 import audio_pb2_grpc
from services.audio.service import AudioService, AudioSettings
from services.gateway.settings import GatewaySettings
from services.gateway.submit import Caller, JobRequest, extract_windows, submit_job
from services.jobs.layout import mels_key, upload_key
from services.jobs.segment_audio import unpack_segment_audio
from services.jobs.store.jobs import AvatarRecord, Job, JobState, TaskKind
from services.serving.channels import StageFailed
from services.serving.errors import InvalidRequest, NoCapacity, NotFound
from services.serving.metrics import Metrics
from services.serving.server import ServiceRunner
from tests.helpers.audio_files import encode_tone
from tests.helpers.stores import Stores, temp_stores

T = TypeVar("T")
AVATAR = "0123456789abcdef01234567"
RID = "5b0c3d52-8a3e-4b1f-9a37-0c6f2b7d9e11"
FPS = 25.0


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    with temp_stores(tmp_path) as s:
        s.jobs.put_avatar(AvatarRecord(AVATAR, "ann", FPS, 1, 64, 64, 1, 1.0, tenant="acme"))
        yield s


@contextlib.asynccontextmanager
async def audio_stage(metrics: Metrics) -> AsyncIterator[audio_pb2_grpc.AudioServiceStub]:
    """The audio stage on an ephemeral port of 127.0.0.1, in this event loop."""
    settings = AudioSettings(host="127.0.0.1", port=0, metrics_port=-1, grace_s=0.5, extract_processes=0)
    runner = ServiceRunner(AudioService(settings, metrics))
    await runner.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runner.port}") as channel:
            yield audio_pb2_grpc.AudioServiceStub(channel)
    finally:
        await runner.stop()


def with_audio(call: Callable[[audio_pb2_grpc.AudioServiceStub], Awaitable[T]], metrics: Metrics | None = None) -> T:
    async def run() -> T:
        async with audio_stage(metrics or Metrics("audio")) as stub:
            return await call(stub)

    return asyncio.run(run())


def submit(
    stores: Stores, seconds: float = 2.4, tenant: str = "acme", metrics: Metrics | None = None, **settings: float
) -> Job:
    audio = encode_tone("wav", seconds, rate=16000, channels=1)
    s = dataclasses.replace(GatewaySettings(), segment_seconds=1.0, **settings)
    request = JobRequest(AVATAR, audio, b"\x08\x01")
    caller = Caller(tenant, "tenant:acme", "req-1", '{"traceparent": "00-ab-cd-01"}')
    return with_audio(lambda stub: submit_job(stores.jobs, stores.blobs, stub, s, request, caller), metrics)


def extract_calls(metrics: Metrics) -> float:
    return sum(
        s.value
        for m in metrics.registry.collect()
        if m.name == "lipline_stage_requests"
        for s in m.samples
        if s.name.endswith("_total")
    )


def test_a_job_is_queued_with_its_audio_task_segments_and_their_windows(stores: Stores) -> None:
    metrics = Metrics("audio")
    job = submit(stores, seconds=2.4, metrics=metrics)
    assert extract_calls(metrics) == 1
    assert (job.state, job.avatar_id, job.owner, job.tenant, job.options) == (
        JobState.QUEUED,
        AVATAR,
        "tenant:acme",
        "acme",
        b"\x08\x01",
    )
    assert job.trace_context == '{"traceparent": "00-ab-cd-01"}'
    assert (job.total_frames, job.fps) == (60, FPS)
    assert (
        job.segments_total == 2
    )  # 60 frames in 1 s segments: 25 + 35 (a short tail merges); the audio task is no segment
    assert job.audio_seconds == pytest.approx(2.4, abs=0.01)
    assert {"audio", "submit"} <= set(job.stage_seconds)
    tasks = []
    while (task := stores.jobs.claim("w", 60.0, 3)) is not None:
        tasks.append((task.index, task.kind, task.start_frame, task.end_frame))
    assert tasks == [(0, TaskKind.AUDIO, 0, 0), (1, TaskKind.SEGMENT, 0, 25), (2, TaskKind.SEGMENT, 25, 60)]
    assert stores.blobs.get(upload_key(job.id)) == encode_tone("wav", 2.4, rate=16000, channels=1)
    assert stores.blob_keys() == sorted([upload_key(job.id), mels_key(job.id, 1), mels_key(job.id, 2)])
    assert len(unpack_segment_audio(stores.blobs.get(mels_key(job.id, 2)), 35)) == 35


def test_another_tenants_avatar_is_not_found_before_any_work(stores: Stores) -> None:
    metrics = Metrics("audio")
    with pytest.raises(NotFound, match=AVATAR):
        submit(stores, tenant="globex", metrics=metrics)
    assert extract_calls(metrics) == 0  # refused before the audio stage is asked
    assert stores.blob_keys() == []
    assert stores.jobs.queue_stats().active_jobs == 0


def test_audio_over_the_limit_is_refused_and_leaves_nothing(stores: Stores) -> None:
    with pytest.raises(StageFailed) as err:
        submit(stores, seconds=3.0, max_audio_seconds=2.0)
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stores.blob_keys() == []
    assert stores.jobs.queue_stats().active_jobs == 0


def test_the_active_job_limit_refuses_before_the_audio_is_stored(stores: Stores) -> None:
    submit(stores)
    keys = stores.blob_keys()
    with pytest.raises(NoCapacity, match=r"1 jobs are queued or running \(limit 1\)") as err:
        submit(stores, max_active_jobs=1)
    assert stores.blob_keys() == keys  # the refused job stored nothing
    # a full queue is worth trying again: the refusal carries the gateway's back-off hint
    assert err.value.trailing_metadata() == (("retry-after-ms", "5000"),)


def test_a_job_the_store_refuses_leaves_no_blobs(stores: Stores) -> None:
    """create_job's own check (here: the per-client limit) comes after the blobs are stored: they go."""
    submit(stores)
    keys = stores.blob_keys()
    with pytest.raises(NoCapacity, match="client 'tenant:acme' has 1 jobs queued or running") as err:
        submit(stores, max_active_jobs_per_client=1, queue_retry_after_ms=750)
    assert stores.blob_keys() == keys
    assert err.value.retry_after_ms == 750  # the store's refusal, with this gateway's hint


def submit_many(stores: Stores, requests: list[JobRequest], metrics: Metrics) -> list[Job]:
    """Submit `requests` concurrently on one event loop (as one gateway would)."""
    s = dataclasses.replace(GatewaySettings(), segment_seconds=1.0)
    caller = Caller("acme", "tenant:acme", "req-1")

    async def run(stub: audio_pb2_grpc.AudioServiceStub) -> list[Job]:
        return list(
            await asyncio.gather(*(submit_job(stores.jobs, stores.blobs, stub, s, r, caller) for r in requests))
        )

    return with_audio(run, metrics)


def test_a_repeated_request_id_returns_the_first_job_without_work(stores: Stores) -> None:
    audio = encode_tone("wav", 1.2, rate=16000, channels=1)
    request = JobRequest(AVATAR, audio, b"\x08\x01", RID, {"order": "1"})
    metrics = Metrics("audio")
    first = submit_many(stores, [request], metrics)[0]
    keys = stores.blob_keys()
    again = submit_many(stores, [request], metrics)[0]
    assert (again.id, again.labels, extract_calls(metrics)) == (first.id, {"order": "1"}, 1)  # no second decode
    with pytest.raises(InvalidRequest, match=f"request_id {RID} was already used for a different job request"):
        submit_many(stores, [dataclasses.replace(request, labels={"order": "2"})], metrics)
    assert stores.blob_keys() == keys


def test_concurrent_duplicates_make_one_job_and_leave_only_its_blobs(stores: Stores) -> None:
    audio = encode_tone("wav", 1.2, rate=16000, channels=1)
    request = JobRequest(AVATAR, audio, b"\x08\x01", RID)
    metrics = Metrics("audio")
    jobs = submit_many(stores, [request] * 4, metrics)
    assert extract_calls(metrics) == 4  # all four passed the early lookup: create_job settled it
    assert len({j.id for j in jobs}) == 1
    assert stores.jobs.queue_stats().active_jobs == 1
    assert {k.split("/")[1] for k in stores.blob_keys()} == {jobs[0].id}  # the losers' uploads are gone


def test_a_retried_audio_uri_request_is_its_first_job_even_after_the_file_changed(stores: Stores) -> None:
    """Issue 29 item 5: the id is looked up before the URI is fetched, and the digest is of the request
    as sent (the URI), so a retry gets its job without a fetch, whatever the file holds now; another
    URI with the same id is still another request, refused before a fetch."""
    uri = "https://media.example.com/speech.wav"
    served = [encode_tone("wav", 1.2, rate=16000, channels=1)]
    fetched: list[bytes] = []

    async def fetch() -> bytes:
        fetched.append(served[0])
        return served[0]

    s = dataclasses.replace(GatewaySettings(), segment_seconds=1.0)
    caller = Caller("acme", "tenant:acme", "req-1")
    request = JobRequest(AVATAR, b"", b"\x08\x01", RID, audio_uri=uri)

    def submit_uri(r: JobRequest) -> Job:
        return with_audio(lambda stub: submit_job(stores.jobs, stores.blobs, stub, s, r, caller, fetch))

    first = submit_uri(request)
    assert stores.blobs.get(upload_key(first.id)) == served[0] and len(fetched) == 1
    served[0] = encode_tone("wav", 2.0, rate=16000, channels=1)  # the file behind the URI changed
    assert submit_uri(request).id == first.id
    assert len(fetched) == 1  # the retry fetched nothing
    with pytest.raises(InvalidRequest, match=f"request_id {RID} was already used for a different job request"):
        submit_uri(dataclasses.replace(request, audio_uri=uri + "?v=2"))
    assert len(fetched) == 1 and stores.jobs.queue_stats().active_jobs == 1


class ReadableFirstMiB(bytes):
    """Audio of which only the first MiB can be read (an upload whose storage fails mid-read)."""

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, slice) and (key.start or 0) > 0:
            raise OSError("the upload could not be read past its first MiB")
        return super().__getitem__(key)


def test_audio_that_fails_while_it_is_sent_to_the_audio_stage_fails_as_itself() -> None:
    """Extract's request stream reads the upload: its failure reaches the caller as itself (on main,
    gRPC turned it into a bare cancel of the stage call)."""
    audio = ReadableFirstMiB(encode_tone("wav", 40.0, rate=16000, channels=1))  # 1.3 MB: two messages
    with pytest.raises(OSError, match="past its first MiB"):
        with_audio(lambda stub: extract_windows(stub, audio, FPS, 600.0, "req-1"))
