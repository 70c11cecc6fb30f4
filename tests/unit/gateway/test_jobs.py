"""Tests for services.gateway.jobs: the job table, its limits, the proto view and change notification."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from lipline.v1 import common_pb2, gateway_pb2
from services.common.errors import NotFound, TooLarge
from services.gateway.jobs import JobRecord, JobStore

OPTIONS = gateway_pb2.JobOptions(super_resolution=True, crf=23)


def _finish(job: JobRecord, state: int = gateway_pb2.JOB_STATE_SUCCEEDED) -> None:
    job.state = state


def test_create_and_get() -> None:
    store = JobStore()
    job = store.create("avatar1", OPTIONS, 12.5)
    assert store.get(job.id) is job
    assert (job.avatar_id, job.options, job.audio_seconds) == ("avatar1", OPTIONS, 12.5)
    assert job.state == gateway_pb2.JOB_STATE_QUEUED
    assert not job.terminal
    assert len(job.id) == 20
    other = store.create("avatar1", OPTIONS, 1.0)
    assert other.id != job.id
    assert store.active() == [job, other]


def test_get_unknown_job_is_not_found() -> None:
    with pytest.raises(NotFound, match="'nope' does not exist"):
        JobStore().get("nope")


def test_active_limit_is_too_large_and_frees_up_when_jobs_finish() -> None:
    store = JobStore(max_active=2)
    first = store.create("a", OPTIONS, 1.0)
    store.create("a", OPTIONS, 1.0)
    with pytest.raises(TooLarge, match=r"limit 2"):
        store.create("a", OPTIONS, 1.0)
    assert TooLarge.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    _finish(first, gateway_pb2.JOB_STATE_FAILED)
    third = store.create("a", OPTIONS, 1.0)
    assert store.get(third.id) is third
    assert first not in store.active()


@pytest.mark.parametrize(
    ("state", "terminal"),
    [(gateway_pb2.JOB_STATE_QUEUED, False), (gateway_pb2.JOB_STATE_RUNNING, False),
     (gateway_pb2.JOB_STATE_SUCCEEDED, True), (gateway_pb2.JOB_STATE_FAILED, True),
     (gateway_pb2.JOB_STATE_CANCELLED, True)],
)
def test_terminal_states(state: int, terminal: bool) -> None:
    job = JobRecord("j", "a", OPTIONS, 1.0)
    job.state = state
    assert job.terminal is terminal


def test_oldest_finished_jobs_are_forgotten_beyond_max_jobs() -> None:
    store = JobStore(max_jobs=3, max_active=10)
    a, b, c = (store.create("x", OPTIONS, 1.0) for _ in range(3))
    _finish(b)
    _finish(c, gateway_pb2.JOB_STATE_CANCELLED)
    d = store.create("x", OPTIONS, 1.0)  # 4 > 3: forget b, the oldest finished one (a is still active)
    assert store.get(a.id) is a
    with pytest.raises(NotFound, match="forgotten"):
        store.get(b.id)
    assert store.get(c.id) is c and store.get(d.id) is d
    e = store.create("x", OPTIONS, 1.0)  # forget c
    with pytest.raises(NotFound):
        store.get(c.id)
    assert [store.get(j.id) for j in (a, d, e)] == [a, d, e]


def test_active_jobs_are_never_forgotten() -> None:
    store = JobStore(max_jobs=2, max_active=10)
    jobs = [store.create("x", OPTIONS, 1.0) for _ in range(4)]
    for job in jobs:
        assert store.get(job.id) is job
    assert store.active() == jobs


def test_to_proto_queued() -> None:
    job = JobRecord("j1", "av", OPTIONS, 8.0, create_time=1_700_000_000.25)
    msg = job.to_proto()
    assert (msg.id, msg.avatar_id, msg.state, msg.stage) == ("j1", "av", gateway_pb2.JOB_STATE_QUEUED, "queued")
    assert msg.progress == 0.0
    assert msg.elapsed_seconds == 0.0
    assert msg.eta_seconds == 0.0
    assert msg.realtime_factor == 0.0
    assert msg.audio_seconds == 8.0
    assert msg.options == OPTIONS
    assert msg.error_code == grpc.StatusCode.OK.value[0]
    assert msg.create_time.ToNanoseconds() == pytest.approx(1_700_000_000_250_000_000, abs=1000)  # float seconds


def test_to_proto_running_progress_and_eta() -> None:
    job = JobRecord("j", "a", OPTIONS, 8.0)
    job.state = gateway_pb2.JOB_STATE_RUNNING
    job.stage = "render"
    job.total_frames, job.frames_done = 200, 50
    job.started = time.time() - 10.0
    msg = job.to_proto()
    assert msg.progress == pytest.approx(0.25)
    assert msg.elapsed_seconds == pytest.approx(10.0, abs=0.5)
    assert msg.eta_seconds == pytest.approx(30.0, abs=1.5)  # 10 s for 50 frames, 150 to go
    assert msg.realtime_factor == 0.0  # only once SUCCEEDED
    assert msg.stage == "render"
    assert (msg.frames_done, msg.total_frames) == (50, 200)


def test_to_proto_running_without_frames_has_no_eta() -> None:
    job = JobRecord("j", "a", OPTIONS, 8.0)
    job.state = gateway_pb2.JOB_STATE_RUNNING
    job.total_frames = 200
    job.started = time.time() - 3.0
    msg = job.to_proto()
    assert msg.progress == 0.0
    assert msg.eta_seconds == 0.0


def test_to_proto_succeeded_realtime_factor() -> None:
    job = JobRecord("j", "a", OPTIONS, audio_seconds=20.0)
    job.state = gateway_pb2.JOB_STATE_SUCCEEDED
    job.total_frames, job.frames_done = 500, 499
    job.started, job.finished = 1000.0, 1008.0
    job.output_bytes = 123456
    job.models = [common_pb2.ModelInfo(name="procedural", backend="cpu", precision="fp32")]
    msg = job.to_proto()
    assert msg.progress == 1.0
    assert msg.elapsed_seconds == pytest.approx(8.0)
    assert msg.realtime_factor == pytest.approx(2.5)
    assert msg.eta_seconds == 0.0
    assert msg.output_bytes == 123456
    assert [m.name for m in msg.models] == ["procedural"]


def test_to_proto_stage_seconds() -> None:
    job = JobRecord("j", "a", OPTIONS, 20.0)
    assert dict(job.to_proto().stage_seconds) == {}  # nothing measured yet
    job.stage_seconds["audio_decode"] = 0.05
    job.state = gateway_pb2.JOB_STATE_RUNNING
    job.stage_seconds.update(audio=0.4, lipsync=1.5)
    assert dict(job.to_proto().stage_seconds) == {"audio_decode": 0.05, "audio": 0.4, "lipsync": 1.5}
    job.state = gateway_pb2.JOB_STATE_SUCCEEDED
    times = {"audio_decode": 0.05, "audio": 0.5, "lipsync": 6.0, "superres": 6.5, "composite": 1.25,
             "encode": 3.0, "first_frame": 0.75, "total": 7.0}
    job.stage_seconds.update(times)
    msg = job.to_proto()
    assert dict(msg.stage_seconds) == pytest.approx(times)


def test_to_proto_failed_carries_the_error() -> None:
    job = JobRecord("j", "a", OPTIONS, 5.0)
    job.state = gateway_pb2.JOB_STATE_FAILED
    job.error = "no face"
    job.error_code = grpc.StatusCode.INVALID_ARGUMENT
    job.total_frames, job.frames_done = 100, 10
    job.started, job.finished = 100.0, 102.0
    msg = job.to_proto()
    assert msg.error == "no face"
    assert msg.error_code == 3  # google.rpc.Code INVALID_ARGUMENT
    assert msg.progress == pytest.approx(0.1)
    assert msg.realtime_factor == 0.0
    assert msg.elapsed_seconds == pytest.approx(2.0)


def test_notify_wakes_wait_change() -> None:
    async def main() -> None:
        job = JobRecord("j", "a", OPTIONS, 1.0)
        loop = asyncio.get_running_loop()
        waiters = [asyncio.create_task(job.wait_change(5.0)) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert not any(w.done() for w in waiters)
        start = loop.time()
        job.notify()
        await asyncio.wait_for(asyncio.gather(*waiters), 2.0)
        assert loop.time() - start < 1.0
        # A new wait after the notification waits for the next one.
        later = asyncio.create_task(job.wait_change(5.0))
        await asyncio.sleep(0.01)
        assert not later.done()
        job.notify()
        await asyncio.wait_for(later, 2.0)

    asyncio.run(main())


def test_wait_change_times_out_quietly() -> None:
    async def main() -> float:
        job = JobRecord("j", "a", OPTIONS, 1.0)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await job.wait_change(0.05)  # no exception
        return loop.time() - start

    took = asyncio.run(main())
    assert 0.04 <= took < 1.0


def test_job_created_outside_a_loop_can_be_watched_in_one() -> None:
    store = JobStore()
    job = store.create("a", OPTIONS, 1.0)  # like the gateway's sync code paths

    async def main() -> None:
        waiter = asyncio.create_task(job.wait_change(5.0))
        await asyncio.sleep(0.01)
        job.notify()
        await asyncio.wait_for(waiter, 2.0)

    asyncio.run(main())
