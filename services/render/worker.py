"""The render worker's loop: claim a task, keep its lease alive, do it, report it; repeat.

What a task does (a segment, a job's audio track, its join) is `services.render.tasks`; this module
is only the lease around it, so the loop can be tested with a stand-in runner
(tests/unit/render/test_worker_loop.py). The job store hands out tasks
atomically with a lease; this loop renews the lease every `heartbeat_s` while it works. A renewal
that fails means the lease is gone (the job was cancelled or failed, or this worker stalled past
the lease and another took the task): the work is dropped at once and nothing it made is kept.

Failures: one that may pass (a stage UNAVAILABLE because a replica went away, the job store or blob
store unavailable, a full blob store) gives the task back with exponential back-off and jitter (a
not-before time on the task: other tasks are claimed meanwhile), and fails the job only once the task
has kept failing for `retry_window_s`; such failures do not count against `max_attempts`. An
unexpected error (a bug) gives it back with back-off too, counted against `max_attempts`, as a worker
killed outright is (its lease expires and the task is claimed again). One that cannot pass
(INVALID_ARGUMENT, ...) fails the job with the stage's status and message. A row or blob this lipline
cannot interpret (services.serving.errors.CorruptRecord) fails its job at once with DATA_LOSS: it is
quarantined, never retried, never allowed to stop the loop.

Health: the loop records when it last iterated (or renewed a lease); `loop_health` says whether it
ended or stalled, which the service turns into NOT_SERVING (the chart's liveness probe restarts it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeGuard

import grpc

from services.jobs.layout import job_prefix, output_key
from services.jobs.store.blobs import BlobStore
from services.jobs.store.jobs import JobState, JobStore, Task, TaskKind
from services.render.settings import RenderSettings
from services.serving.channels import StageFailed
from services.serving.errors import (
    RETRYABLE_STORE_ERRORS,
    CorruptRecord,
    LiplineError,
    NotFound,
    NotReady,
    StoreUnavailable,
)
from services.serving.metrics import Metrics
from services.serving.tracing import record_job_span

_LOGGER = logging.getLogger(__name__)


class LeaseLost(Exception):
    """The task's lease is no longer ours; drop the work."""


class TaskRunner(Protocol):
    """What the loop runs a claimed task with (services.render.tasks.RenderTasks in a worker)."""

    async def run(self, task: Task) -> None:
        """Do the task and report it to the job store (complete_segment / complete_join); raise
        LeaseLost when the store refuses the report, any other error when the task failed."""


PURGE_EVERY_S = 30.0  # how often a worker deletes tasks whose job row is gone (cheap; any worker may)
LOOP_ERROR_PAUSE_S = (1.0, 10.0)  # back-off of the claim loop after an unexpected error (first, longest)


def backoff_delay(failures: int, first_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Exponential back-off with "equal jitter": half of min(max, first * 2**failures) plus a random
    part up to the other half, so tasks that failed together (a stage restart) do not retry in step."""
    capped = min(max_s, first_s * (2 ** min(failures, 30)))
    return capped / 2 + (rng or random).uniform(0, capped / 2)


def task_label(task: Task) -> str:
    """The task in a job's error message."""
    return {TaskKind.JOIN: "the join", TaskKind.AUDIO: "the audio track"}.get(task.kind, f"segment {task.index}")


def is_retryable(exc: BaseException) -> TypeGuard[LiplineError]:
    """A failure that may pass by itself: a stage's retryable status, a store unavailable or full."""
    if isinstance(exc, StageFailed):
        return exc.retryable
    return isinstance(exc, (*RETRYABLE_STORE_ERRORS, NotReady))


class RenderWorker:
    def __init__(
        self,
        settings: RenderSettings,
        metrics: Metrics,
        jobs: JobStore,
        blobs: BlobStore,
        runner: TaskRunner,
        name: str,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.jobs = jobs
        self.blobs = blobs  # a failed job's blobs are deleted here
        self.runner = runner
        self.name = name
        self._stopping = asyncio.Event()
        self._current: asyncio.Task | None = None
        self._current_task: Task | None = None
        self._claimed_at = 0.0  # monotonic time of the current task's claim
        self.last_beat = time.monotonic()  # the loop's last iteration or lease renewal (health)
        self.loop_ended: str = ""  # why the loop ended, when it has ended other than by drain
        self._next_purge = 0.0

    # -- loop ---------------------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def loop_health(self) -> str:
        """ "" while the loop works; else why it does not (ended, or no iteration for loop_stall_s)."""
        if self.loop_ended:
            return self.loop_ended
        idle = time.monotonic() - self.last_beat
        if idle > self.settings.loop_stall_s:
            where = (
                f"inside {self._current_task.job_id} segment {self._current_task.index}"
                if self._current_task
                else "claiming a task"
            )
            return f"the claim loop has not moved for {idle:.0f} s (limit {self.settings.loop_stall_s:g} s), {where}"
        return ""

    async def run(self) -> None:
        """The claim loop. Never ends by itself but on drain: an unexpected error (a bug, a row it
        cannot read) is logged and the loop goes on after a pause; `loop_ended` says why if it does."""
        try:
            await self._loop()
        except asyncio.CancelledError:
            if not self._stopping.is_set():
                self.loop_ended = "the claim loop was cancelled"
            raise
        except BaseException as exc:
            self.loop_ended = f"the claim loop ended: {type(exc).__name__}: {exc}"
            _LOGGER.exception("claim loop ended", extra={"worker": self.name})
            raise
        if not self._stopping.is_set():
            self.loop_ended = "the claim loop returned"

    async def _loop(self) -> None:
        s = self.settings
        errors = 0
        while not self._stopping.is_set():
            self.last_beat = time.monotonic()
            try:
                await self._purge_orphans()
                task = await asyncio.to_thread(
                    self.jobs.claim, self.name, s.lease_s, s.max_attempts, s.max_tenant_share
                )
            except StoreUnavailable as exc:
                _LOGGER.warning("job store unavailable; retrying", extra={"error": str(exc)})
                await self._pause(1.0)
                continue
            except Exception as exc:  # never let one bad row end the loop
                errors += 1
                pause = backoff_delay(errors - 1, *LOOP_ERROR_PAUSE_S)
                _LOGGER.error(
                    "claiming a task failed; retrying in %.1f s",
                    pause,
                    exc_info=True,
                    extra={"error": f"{type(exc).__name__}: {exc}"},
                )
                await self._pause(pause)
                continue
            errors = 0
            if task is None:
                await self._pause(s.poll_s)
                continue
            self.metrics.queue_wait_seconds.observe(max(0.0, time.time() - task.ready_time))
            _LOGGER.info("task claimed", extra={"job_id": task.job_id, "segment": task.index, "attempt": task.attempts})
            self._current_task = task
            self._claimed_at = time.monotonic()
            self._current = asyncio.create_task(self._run_task(task))
            try:
                await asyncio.shield(self._current)
            except asyncio.CancelledError:
                if not self._current.done():
                    raise
            finally:
                self._current = None
                self._current_task = None

    async def _purge_orphans(self) -> None:
        """Every PURGE_EVERY_S: delete tasks whose job row is gone (they would wait forever)."""
        if time.monotonic() < self._next_purge:
            return
        self._next_purge = time.monotonic() + PURGE_EVERY_S
        purged = await asyncio.to_thread(self.jobs.purge_orphan_tasks)
        if purged:
            self.metrics.quarantined.labels("orphan_task").inc(purged)
            _LOGGER.warning("deleted tasks whose job no longer exists", extra={"tasks": purged})

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def drain(self, timeout: float) -> None:
        """SIGTERM: stop claiming; let the current task finish within `timeout`, else give it back."""
        self._stopping.set()
        current, task = self._current, self._current_task
        if current is None or task is None:
            return
        done, _ = await asyncio.wait({current}, timeout=timeout)
        if not done:
            current.cancel()
            with contextlib.suppress(BaseException):
                await current
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.jobs.release, task, False)
            _LOGGER.info("task given back on shutdown", extra={"job_id": task.job_id, "segment": task.index})

    # -- one task -------------------------------------------------------------------------------------

    async def _run_task(self, task: Task) -> None:
        m = self.metrics
        m.render_busy.set(1)
        work = asyncio.create_task(self.runner.run(task))
        heartbeat = asyncio.create_task(self._heartbeat(task))
        try:
            done, _ = await asyncio.wait({work, heartbeat}, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:  # the lease went away first
                work.cancel()
                with contextlib.suppress(BaseException):
                    await work
                raise LeaseLost()
            heartbeat.cancel()
            work.result()
            m.segments.labels("done").inc()
            _LOGGER.info("task done", extra={"job_id": task.job_id, "segment": task.index})
        except LeaseLost:
            m.lease_lost.inc()
            m.segments.labels("lease_lost").inc()
            _LOGGER.info("lease lost; work dropped", extra={"job_id": task.job_id, "segment": task.index})
            await self._sweep_if_ended(task)
        except asyncio.CancelledError:
            work.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - one task's failure never stops the worker
            await self._failed(task, exc)
        finally:
            heartbeat.cancel()
            m.render_busy.set(0)

    async def _sweep_if_ended(self, task: Task) -> None:
        """After dropped work has ended (every upload it started has finished: RenderTasks waits for
        them), delete the job's working files when the job has ended, and its output unless it
        succeeded. The job's own deletes (CancelJob, a failed task, the join) may have run before this
        worker's last upload landed; checking the state only after the work ended closes that gap: a job
        still running here is deleted later by whoever ends it. A job still running means another
        worker holds the task, and the key it writes is this task's own, so nothing is deleted."""
        try:
            job = await asyncio.to_thread(self.jobs.get_job, task.job_id)
        except NotFound:
            job = None  # deleted (DeleteJob takes only an ended job): nothing of it is wanted
        except Exception:  # the janitor's pass over ended jobs is the backstop
            _LOGGER.warning("could not look at a dropped task's job", exc_info=True, extra={"job_id": task.job_id})
            return
        if job is not None and not job.terminal:
            return
        swept = await self._quietly(self.blobs.delete_prefix, job_prefix(task.job_id))
        if job is None or job.state != JobState.SUCCEEDED:
            await self._quietly(self.blobs.delete, output_key(task.job_id))
        if swept:
            _LOGGER.info("deleted an ended job's late files", extra={"job_id": task.job_id, "files": swept})

    async def _heartbeat(self, task: Task) -> None:
        """Renew the lease until it is refused (return = lost) or this task is cancelled."""
        s = self.settings
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(s.heartbeat_s)
            self.last_beat = time.monotonic()  # the worker is alive inside a task
            try:
                if not await asyncio.to_thread(self.jobs.renew, task, s.lease_s):
                    return
                last_ok = time.monotonic()
            except StoreUnavailable:
                if time.monotonic() - last_ok > s.lease_s:
                    return  # the lease has surely expired by now

    async def _failed(self, task: Task, exc: Exception) -> None:
        s, m = self.settings, self.metrics
        where = task_label(task)
        error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, LiplineError) else str(exc)
        if is_retryable(exc):
            # Bounded by time, not attempts: a rolling update or a replaced pod outlasts a burst.
            failing_for = task.failing_for_s + (time.monotonic() - self._claimed_at) if task.failures else 0.0
            if failing_for < s.retry_window_s:
                delay = backoff_delay(task.failures, s.retry_backoff_s, s.retry_backoff_max_s)
                m.segments.labels("retried").inc()
                _LOGGER.warning(
                    "task failed; given back for another attempt in %.1f s",
                    delay,
                    extra={"job_id": task.job_id, "segment": task.index, "failures": task.failures + 1, "error": error},
                )
                await self._quietly(self.jobs.release, task, False, delay, error)
                return
            code = exc.code
            message = (
                f"{where} kept failing for {failing_for:.0f} s ({task.failures + 1} attempts; "
                f"the retry window is {s.retry_window_s:g} s); last error: {error}"
            )
        elif isinstance(exc, CorruptRecord):
            m.quarantined.labels("corrupt_record").inc()
            _LOGGER.error(
                "job quarantined: a record it needs cannot be read",
                extra={"job_id": task.job_id, "segment": task.index, "error": error},
            )
            code, message = exc.code, str(exc)
        elif isinstance(exc, NotFound) and not await self._quietly(self.jobs.job_versions, [task.job_id]):
            m.quarantined.labels("orphan_task").inc()
            _LOGGER.warning(
                "the task's job no longer exists; task deleted", extra={"job_id": task.job_id, "segment": task.index}
            )
            await self._quietly(self.jobs.purge_orphan_tasks)
            return
        elif isinstance(exc, LiplineError):
            code, message = exc.code, str(exc)
        else:
            _LOGGER.exception("task crashed", extra={"job_id": task.job_id, "segment": task.index})
            if task.attempts < s.max_attempts:
                m.segments.labels("retried").inc()
                delay = backoff_delay(task.attempts - 1, s.retry_backoff_s, s.retry_backoff_max_s)
                await self._quietly(self.jobs.release, task, True, delay, error)
                return
            code, message = (
                grpc.StatusCode.INTERNAL,
                f"internal error in a render worker ({type(exc).__name__}); its log has details",
            )
        m.segments.labels("failed").inc()
        if isinstance(exc, StageFailed) and not is_retryable(exc):
            message = f"{where} failed after {task.attempts} attempt(s): {message}"
        if await self._quietly(self.jobs.fail_job, task.job_id, message, code.value[0]):
            m.jobs.labels("failed").inc()
            await self._quietly(self.blobs.delete_prefix, job_prefix(task.job_id))
            job = await self._quietly(self.jobs.get_job, task.job_id)
            if job is not None:
                record_job_span(job.id, job.trace_context, job.create_time, "failed", error=message)
        _LOGGER.warning("job failed", extra={"job_id": task.job_id, "segment": task.index, "error": message})

    async def _quietly(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args)
        except Exception:
            _LOGGER.warning("could not record a task's outcome", exc_info=True)
            return None
