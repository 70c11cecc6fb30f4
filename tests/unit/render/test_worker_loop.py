"""The render worker's lease loop (services/render/worker.py) on a real SQLite job store and a folder
blob store, with a stand-in task runner in place of the task bodies (services/render/tasks.py): what
the loop decides (renew, drop, retry, fail, quarantine, drain) is checked apart from what a task does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from services.jobs.layout import job_prefix
from services.jobs.store import open_blob_store, open_job_store
from services.jobs.store.blobs import BlobStore
from services.jobs.store.jobs import JobState, JobStore, NewJob, Task, TaskKind
from services.render.settings import RenderSettings
from services.render.worker import LeaseLost, RenderWorker
from services.serving.errors import CorruptRecord, InvalidMedia, StoreUnavailable
from services.serving.metrics import Metrics

Body = Callable[[Task], Awaitable[None]]


@dataclasses.dataclass
class Runner:
    """The stand-in for RenderTasks: runs `body` for every task and records what happened."""

    jobs: JobStore
    body: Body
    started: list[Task] = dataclasses.field(default_factory=list)
    finished: list[Task] = dataclasses.field(default_factory=list)
    cancelled: list[Task] = dataclasses.field(default_factory=list)

    async def run(self, task: Task) -> None:
        self.started.append(task)
        try:
            await self.body(task)
        except asyncio.CancelledError:
            self.cancelled.append(task)
            raise
        self.finished.append(task)

    async def complete(self, task: Task) -> None:
        """What a body does at its end: report the task (LeaseLost when the store refuses)."""
        if task.kind is TaskKind.JOIN:
            ok = await asyncio.to_thread(self.jobs.complete_join, task, f"outputs/{task.job_id}.mp4", 1, {})
        else:
            ok = await asyncio.to_thread(self.jobs.complete_segment, task, task.end_frame - task.start_frame, {}, [])
        if not ok:
            raise LeaseLost()


@dataclasses.dataclass
class Rig:
    jobs: JobStore
    blobs: BlobStore
    registry: CollectorRegistry
    settings: RenderSettings
    db: Path

    def worker(self, body: Body, **settings: float) -> tuple[RenderWorker, Runner]:
        runner = Runner(self.jobs, body)
        s = dataclasses.replace(self.settings, **settings)
        return RenderWorker(s, Metrics("render", registry=self.registry), self.jobs, self.blobs, runner, "w1"), runner

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def task_row(self, job_id: str, index: int) -> sqlite3.Row:
        with sqlite3.connect(self.db) as conn:
            conn.row_factory = sqlite3.Row
            return conn.execute("SELECT * FROM tasks WHERE job_id = ? AND idx = ?", (job_id, index)).fetchone()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    jobs = open_job_store(f"sqlite:///{tmp_path}/jobs.db")
    jobs.migrate()
    settings = RenderSettings(
        cache_dir=str(tmp_path / "cache"),
        lease_s=0.6,
        heartbeat_s=0.1,
        poll_s=0.02,
        retry_backoff_s=5.0,
        retry_backoff_max_s=10.0,
        retry_window_s=60.0,
        max_attempts=3,
    )
    yield Rig(jobs, open_blob_store(str(tmp_path / "blobs")), CollectorRegistry(), settings, tmp_path / "jobs.db")
    jobs.close()


def new_job(jobs: JobStore, job_id: str = "j1", segments: int = 1) -> None:
    jobs.create_job(
        NewJob(
            job_id,
            "avatar",
            "owner",
            b"",
            segments * 0.4,
            25.0,
            segments * 10,
            [(i * 10, (i + 1) * 10) for i in range(segments)],
        )
    )


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.01)


async def run_until(worker: RenderWorker, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Run the claim loop until `condition` holds, then drain it."""
    loop = asyncio.create_task(worker.run())
    try:
        await until(condition, timeout)
    finally:
        await worker.drain(1.0)
        await asyncio.wait_for(loop, 5)


def test_the_lease_is_renewed_while_a_task_outlasts_it(rig: Rig) -> None:
    new_job(rig.jobs)
    thief_got: list[Task | None] = []

    # A 3 s lease renewed every 0.1 s: a loaded 2-core CI machine's stalls stay well inside it
    # (the rig's 0.6 s lease was lost to one once, and a 1.5 s one once more: the task ran twice).
    lease_s = 3.0

    async def body(task: Task) -> None:
        if task.kind is TaskKind.SEGMENT:
            await asyncio.sleep(2 * lease_s)  # two leases long: only renewals keep it ours
            thief_got.append(await asyncio.to_thread(rig.jobs.claim, "thief", 10.0, 3))
        await runner.complete(task)  # the join, claimable once the segment is done, at once

    worker, runner = rig.worker(body, lease_s=lease_s)
    # Until the join is done too: the loop claims it right after the segment, and a drain that came
    # in between would meet it mid-body (a loaded machine's poll of the condition can lag that long).
    asyncio.run(run_until(worker, lambda: len(runner.finished) == 2, timeout=60.0))
    assert [t.kind for t in runner.finished] == [TaskKind.SEGMENT, TaskKind.JOIN]
    assert thief_got == [None]  # no other worker could take it
    assert rig.jobs.get_job("j1").segments_done == 1
    assert rig.metric("lipline_segments_total", status="done") == 2  # every task the loop ran: the segment, the join


def test_a_lost_lease_drops_the_work_and_the_loop_goes_on(rig: Rig) -> None:
    new_job(rig.jobs, "j1")

    async def body(task: Task) -> None:
        if task.job_id == "j1":
            await asyncio.to_thread(rig.jobs.cancel_job, "j1")  # its tasks are deleted: the next renewal fails
            await asyncio.sleep(30)
        await runner.complete(task)

    worker, runner = rig.worker(body)

    async def scenario() -> None:
        loop = asyncio.create_task(worker.run())
        await until(lambda: bool(runner.cancelled), timeout=5)
        new_job(rig.jobs, "j2")  # the worker claims again after dropping j1
        await until(lambda: any(t.job_id == "j2" for t in runner.finished))
        await worker.drain(1.0)
        await asyncio.wait_for(loop, 5)

    asyncio.run(scenario())
    assert [t.job_id for t in runner.cancelled] == ["j1"] and "j1" not in [t.job_id for t in runner.finished]
    assert rig.metric("lipline_lease_lost_total") == 1
    assert rig.metric("lipline_segments_total", status="lease_lost") == 1
    assert rig.jobs.get_job("j1").state == JobState.CANCELLED


@pytest.mark.parametrize("then_deleted", [False, True], ids=["cancelled", "cancelled-and-deleted"])
def test_files_a_dropped_task_stored_after_its_job_was_cancelled_are_deleted(rig: Rig, then_deleted: bool) -> None:
    """CancelJob deletes the job's files at once; a worker whose upload lands after that (its work is
    cancelled only at the next renewal) deletes them once its work has ended, the output too; the
    same when the job's row is gone by then (DeleteJob)."""
    new_job(rig.jobs, "j1")
    rig.blobs.put(job_prefix("j1") + "mels/00000.f16", b"mels")

    async def body(task: Task) -> None:
        await asyncio.to_thread(rig.jobs.cancel_job, "j1")
        await asyncio.to_thread(rig.blobs.delete_prefix, job_prefix("j1"))  # what CancelJob does
        if then_deleted:
            await asyncio.to_thread(rig.jobs.delete_job, "j1")
        rig.blobs.put(job_prefix("j1") + "segments/00000.mp4", b"a late segment")
        rig.blobs.put("outputs/j1.mp4", b"a late output")
        await asyncio.sleep(30)  # cancelled at the next renewal

    worker, runner = rig.worker(body)
    asyncio.run(run_until(worker, lambda: bool(runner.cancelled) and rig.metric("lipline_lease_lost_total") == 1))
    assert rig.blobs.list(job_prefix("j1")) == []
    assert not rig.blobs.exists("outputs/j1.mp4")


def test_a_task_taken_by_another_worker_keeps_its_files(rig: Rig) -> None:
    """A lease lost to another worker (this one stalled): the job goes on, the segment's key is the
    new owner's too, so nothing is deleted."""
    new_job(rig.jobs, "j1", segments=2)
    key = job_prefix("j1") + "segments/00000.mp4"

    async def body(task: Task) -> None:
        rig.blobs.put(key, b"the segment")
        await asyncio.sleep(1.0)  # past the 0.3 s lease with no renewal (heartbeat_s is 10 s)
        assert await asyncio.to_thread(rig.jobs.claim, "w2", 10.0, 3) is not None
        await runner.complete(task)  # refused: LeaseLost

    worker, runner = rig.worker(body, lease_s=0.3, heartbeat_s=10.0)
    asyncio.run(run_until(worker, lambda: rig.metric("lipline_lease_lost_total") == 1))
    assert rig.jobs.get_job("j1").state == JobState.RUNNING
    assert rig.blobs.exists(key)


def test_a_retryable_error_gives_the_task_back_with_back_off_and_no_attempt_counted(rig: Rig) -> None:
    new_job(rig.jobs)

    async def body(task: Task) -> None:
        raise StoreUnavailable("the blob store is away for a moment")

    worker, runner = rig.worker(body)
    before = time.time()
    asyncio.run(run_until(worker, lambda: rig.task_row("j1", 0)["state"] == "waiting" and bool(runner.started)))
    row = rig.task_row("j1", 0)
    assert (row["attempts"], row["failures"]) == (0, 1)
    # equal jitter: at least half the first delay (5 s), so no other claim retries it at once
    assert row["not_before"] >= before + rig.settings.retry_backoff_s / 2
    assert "the blob store is away" in row["last_error"]
    assert len(runner.started) == 1  # not claimed again inside its back-off
    assert rig.jobs.get_job("j1").state == JobState.RUNNING
    assert rig.metric("lipline_segments_total", status="retried") == 1


def test_a_retryable_error_past_the_retry_window_fails_the_job(rig: Rig) -> None:
    new_job(rig.jobs)

    async def body(task: Task) -> None:
        raise StoreUnavailable("the blob store is away for good")

    worker, runner = rig.worker(body, retry_window_s=0.3, retry_backoff_s=0.01, retry_backoff_max_s=0.02)
    asyncio.run(run_until(worker, lambda: rig.jobs.get_job("j1").terminal))
    job = rig.jobs.get_job("j1")
    assert job.state == JobState.FAILED and job.error_code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert "segment 0 kept failing" in job.error and "the blob store is away for good" in job.error
    assert len(runner.started) >= 2  # retried within the window
    assert job.finish_time - job.start_time >= 0.3  # and failed only once past it


def test_a_fatal_error_fails_the_job_with_its_status_and_deletes_its_blobs(rig: Rig) -> None:
    new_job(rig.jobs, segments=2)
    rig.blobs.put(job_prefix("j1") + "upload", b"audio")

    async def body(task: Task) -> None:
        raise InvalidMedia("the upload is not audio")

    worker, runner = rig.worker(body)
    asyncio.run(run_until(worker, lambda: rig.jobs.get_job("j1").terminal))
    job = rig.jobs.get_job("j1")
    assert (job.state, job.error_code, job.error) == (
        JobState.FAILED,
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
        "the upload is not audio",
    )
    assert not rig.blobs.exists(job_prefix("j1") + "upload")
    assert len(runner.started) == 1  # not retried
    assert rig.metric("lipline_jobs_total", status="failed") == 1


def test_an_unreadable_record_quarantines_its_job_with_data_loss(rig: Rig) -> None:
    new_job(rig.jobs)

    async def body(task: Task) -> None:
        raise CorruptRecord("segment 0 of job j1 cannot render: its audio windows are damaged")

    worker, runner = rig.worker(body)
    asyncio.run(run_until(worker, lambda: rig.jobs.get_job("j1").terminal))
    job = rig.jobs.get_job("j1")
    assert (job.state, job.error_code) == (JobState.FAILED, grpc.StatusCode.DATA_LOSS.value[0])
    assert "its audio windows are damaged" in job.error
    assert rig.metric("lipline_quarantined_total", reason="corrupt_record") == 1
    assert len(runner.started) == 1 and worker.loop_ended == ""


def test_drain_gives_back_a_task_that_does_not_finish_in_time_without_counting_it(rig: Rig) -> None:
    new_job(rig.jobs)

    async def body(task: Task) -> None:
        await asyncio.sleep(30)

    worker, runner = rig.worker(body)

    async def scenario() -> None:
        loop = asyncio.create_task(worker.run())
        await until(lambda: bool(runner.started))
        await worker.drain(0.2)
        await asyncio.wait_for(loop, 5)

    asyncio.run(scenario())
    assert len(runner.cancelled) == 1
    row = rig.task_row("j1", 0)
    assert (row["state"], row["attempts"], row["token"]) == ("waiting", 0, "")
    assert worker.loop_ended == ""  # a drain is not a failure of the loop


def test_drain_lets_the_current_task_finish_and_claims_nothing_more(rig: Rig) -> None:
    new_job(rig.jobs, segments=2)

    async def body(task: Task) -> None:
        await asyncio.sleep(0.3)
        await runner.complete(task)

    worker, runner = rig.worker(body)

    async def scenario() -> None:
        loop = asyncio.create_task(worker.run())
        await until(lambda: bool(runner.started))
        await worker.drain(5.0)
        await asyncio.wait_for(loop, 5)

    asyncio.run(scenario())
    assert [t.index for t in runner.finished] == [0] and len(runner.started) == 1
    assert rig.task_row("j1", 1)["state"] == "waiting"
    assert rig.jobs.get_job("j1").segments_done == 1
