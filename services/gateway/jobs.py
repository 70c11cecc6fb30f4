"""Job records and their change notifications (for GetJob, WatchJob and metrics)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections import OrderedDict
from pathlib import Path

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from lipline.v1 import common_pb2, gateway_pb2
from services.common.errors import NotFound, TooLarge

TERMINAL = {gateway_pb2.JOB_STATE_SUCCEEDED, gateway_pb2.JOB_STATE_FAILED, gateway_pb2.JOB_STATE_CANCELLED}


@dataclasses.dataclass
class JobRecord:
    id: str
    avatar_id: str
    options: gateway_pb2.JobOptions
    audio_seconds: float
    create_time: float = dataclasses.field(default_factory=time.time)
    state: int = gateway_pb2.JOB_STATE_QUEUED
    stage: str = "queued"
    frames_done: int = 0
    total_frames: int = 0
    error: str = ""
    error_code: grpc.StatusCode = grpc.StatusCode.OK
    started: float = 0.0
    finished: float = 0.0
    output_path: Path | None = None
    output_bytes: int = 0
    models: list[common_pb2.ModelInfo] = dataclasses.field(default_factory=list)
    # Wall seconds per part of the job (Job.stage_seconds); written on the event loop only.
    stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    task: asyncio.Task | None = None
    _changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def elapsed(self) -> float:
        if not self.started:
            return 0.0
        return (self.finished or time.time()) - self.started

    def notify(self) -> None:
        """Wake every WatchJob of this job (call on the event loop)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass

    def to_proto(self) -> gateway_pb2.Job:
        elapsed = self.elapsed()
        progress = self.frames_done / self.total_frames if self.total_frames else 0.0
        if self.state == gateway_pb2.JOB_STATE_SUCCEEDED:
            progress = 1.0
        eta = 0.0
        if self.state == gateway_pb2.JOB_STATE_RUNNING and self.frames_done:
            eta = elapsed / self.frames_done * (self.total_frames - self.frames_done)
        created = Timestamp()
        created.FromNanoseconds(int(self.create_time * 1e9))
        return gateway_pb2.Job(
            id=self.id,
            avatar_id=self.avatar_id,
            state=self.state,
            progress=progress,
            frames_done=self.frames_done,
            total_frames=self.total_frames,
            stage=self.stage,
            error=self.error,
            error_code=self.error_code.value[0],
            audio_seconds=self.audio_seconds,
            elapsed_seconds=elapsed,
            eta_seconds=eta,
            realtime_factor=self.audio_seconds / elapsed if self.state == gateway_pb2.JOB_STATE_SUCCEEDED and elapsed else 0.0,
            output_bytes=self.output_bytes,
            models=self.models,
            options=self.options,
            create_time=created,
            stage_seconds=self.stage_seconds,
        )


class JobStore:
    """In-memory job table; the oldest finished jobs are forgotten beyond `max_jobs`."""

    def __init__(self, max_jobs: int = 1000, max_active: int = 64) -> None:
        self._jobs: OrderedDict[str, JobRecord] = OrderedDict()
        self._max_jobs = max_jobs
        self._max_active = max_active

    def create(self, avatar_id: str, options: gateway_pb2.JobOptions, audio_seconds: float) -> JobRecord:
        active = sum(not j.terminal for j in self._jobs.values())
        if active >= self._max_active:
            raise TooLarge(f"{active} jobs are queued or running (limit {self._max_active}); retry later")
        job = JobRecord(uuid.uuid4().hex[:20], avatar_id, options, audio_seconds)
        self._jobs[job.id] = job
        while len(self._jobs) > self._max_jobs:
            oldest = next((j for j in self._jobs.values() if j.terminal), None)
            if oldest is None:
                break
            del self._jobs[oldest.id]
        return job

    def get(self, job_id: str) -> JobRecord:
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"job {job_id!r} does not exist (or was forgotten after finishing)")
        return job

    def active(self) -> list[JobRecord]:
        return [j for j in self._jobs.values() if not j.terminal]
