"""What a render worker's tasks do, apart from the lease loop that runs them (services.render.worker).

- a segment: its frames through the stages (services.render.segment), into an MP4 segment;
- the audio task: the job's AAC track, from the upload, beside the segments;
- the join: stream-copy the segments and the AAC track into the output, with its size and sha256.

Each body stores what it made under the task's own key, then reports it to the job store; when the
store refuses the report (the lease is gone: the job ended, or another worker took the task) it
raises LeaseLost. It deletes nothing itself: the key may be the new owner's by then. The loop
(`RenderWorker._sweep_if_ended`) deletes a dropped task's files once the work has ended, and only
when its job has ended. An upload is never abandoned mid-way, even when the task is cancelled, so
that check comes after the last write. Any other error is the loop's to classify (retry, fail the
job, quarantine).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from google.protobuf.message import DecodeError

from lipline.v1 import gateway_pb2, lipsync_pb2
from services.jobs.avatar_cache import AvatarCache, LocalAvatar
from services.jobs.integrity import file_sha256
from services.jobs.layout import (
    audio_key,
    job_prefix,
    mels_key,
    output_key,
    segment_indices,
    segment_key,
    upload_key,
    whisper_key,
)
from services.jobs.segment_audio import SegmentAudio, unpack_segment_audio
from services.jobs.store.blobs import BlobStore
from services.jobs.store.jobs import Job, JobStore, Task, TaskKind
from services.media.audio import decode_audio
from services.media.timeline import loop_frame, loop_mode
from services.media.whisper_mel import SAMPLE_RATE as WHISPER_RATE
from services.media.whisper_mel import SEGMENT_SAMPLES
from services.media.whisper_windows import windows_read
from services.render.mp4 import MUX_AUDIO_RATE, encode_aac, join_segments
from services.render.segment import SegmentRenderer
from services.render.worker import LeaseLost
from services.serving.errors import CorruptRecord, NotFound
from services.serving.metrics import Metrics
from services.serving.stages import MUSETALK_TIER
from services.serving.tracing import job_span, outgoing_metadata, record_job_span

_LOGGER = logging.getLogger(__name__)


class RenderTasks:
    """The task bodies of one worker (a `worker.TaskRunner`)."""

    def __init__(
        self,
        metrics: Metrics,
        jobs: JobStore,
        blobs: BlobStore,
        cache: AvatarCache,
        renderer: SegmentRenderer,
        scratch: Path,
        output_ttl_s: float = 0.0,
    ) -> None:
        self.metrics = metrics
        self.output_ttl_s = output_ttl_s  # the join stamps the output's expiry (services.jobs.retention)
        self.jobs = jobs
        self.blobs = blobs
        self.cache = cache
        self.renderer = renderer
        self._scratch = scratch
        self._scratch.mkdir(parents=True, exist_ok=True)

    async def run(self, task: Task) -> None:
        """Do the task its kind names, inside a span of the job's trace."""
        job = await asyncio.to_thread(self.jobs.get_job, task.job_id)
        with job_span(
            f"render {task.kind.value}",
            job.id,
            job.trace_context,
            task=task.index,
            attempt=task.attempts,
            frames=task.end_frame - task.start_frame,
        ):
            if task.kind is TaskKind.JOIN:
                await self._join(task, job)
            elif task.kind is TaskKind.AUDIO:
                await self._audio(task, job)
            else:
                await self._segment(task, job)

    async def _audio(self, task: Task, job: Job) -> None:
        """The job's AAC track, from its upload (decoded as SubmitJob did), beside the segments."""
        t0 = time.perf_counter()
        try:
            data = await asyncio.to_thread(self.blobs.get, upload_key(job.id))
        except NotFound as exc:
            raise CorruptRecord(
                f"the audio of job {job.id} cannot be encoded: its upload ({upload_key(job.id)}) is missing from the blob store"
            ) from exc
        local = self._scratch / f"{job.id}-audio-{uuid.uuid4().hex[:8]}.m4a"
        try:

            def encode() -> None:
                encode_aac(decode_audio(data, MUX_AUDIO_RATE), MUX_AUDIO_RATE, local)

            await asyncio.to_thread(encode)
            await self._store(audio_key(job.id), local)
        finally:
            local.unlink(missing_ok=True)
        if not await asyncio.to_thread(self.jobs.complete_segment, task, 0, {"aac": time.perf_counter() - t0}, []):
            raise LeaseLost()

    async def _segment(self, task: Task, job: Job) -> None:
        options = gateway_pb2.JobOptions.FromString(job.options)
        try:
            avatar = await asyncio.to_thread(self.cache.get, job.avatar_id)
        except NotFound as exc:
            raise NotFound(f"avatar {job.avatar_id} was deleted before the job finished") from exc
        frames = task.end_frame - task.start_frame
        audio = await self._segment_audio(job, task, frames)
        windows, whisper = 0, []
        if avatar.meta.model == MUSETALK_TIER:
            windows = max(1, -(-round(job.audio_seconds * WHISPER_RATE) // SEGMENT_SAMPLES))  # as SubmitJob stored
            whisper = await self._whisper_windows(job, task, avatar, windows, loop_mode(options))
        local = self._scratch / f"{job.id}-{task.index}-{uuid.uuid4().hex[:8]}.mp4"
        try:
            result = await self.renderer.render(
                avatar,
                task.start_frame,
                task.end_frame,
                audio,
                options.super_resolution,
                options.crf or 20,
                local,
                outgoing_metadata(job.id),
                template_loop=loop_mode(options),
                whisper=whisper,
                whisper_windows=windows,
            )
            key = segment_key(job.id, task.index)
            await self._store(key, local)
        finally:
            local.unlink(missing_ok=True)
        if not await asyncio.to_thread(
            self.jobs.complete_segment, task, result.frames, result.stage_seconds, result.models
        ):
            raise LeaseLost()

    async def _store(self, key: str, path: Path) -> None:
        """Uploads a file the task made. When the task is cancelled meanwhile (its lease went away),
        waits for the upload's thread to end before the cancellation goes on: a thread cannot be
        stopped, and the loop's clean-up of an ended job must come after this task's last write."""
        upload = asyncio.ensure_future(asyncio.to_thread(self.blobs.put_file, key, path))
        try:
            await asyncio.shield(upload)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await upload
            raise

    async def _segment_audio(self, job: Job, task: Task, frames: int) -> SegmentAudio:
        """The segment's mel windows from the blob store; CorruptRecord when missing or malformed
        (SubmitJob wrote them before the job existed: without them the segment can never render)."""
        key = mels_key(job.id, task.index)
        try:
            return unpack_segment_audio(await asyncio.to_thread(self.blobs.get, key), frames)
        except NotFound as exc:
            raise CorruptRecord(
                f"segment {task.index} of job {job.id} cannot render: its audio windows ({key}) are missing from the blob store"
            ) from exc
        except ValueError as exc:
            raise CorruptRecord(
                f"segment {task.index} of job {job.id} cannot render: its audio windows ({key}) are damaged ({exc})"
            ) from exc

    async def _whisper_windows(
        self, job: Job, task: Task, avatar: LocalAvatar, windows: int, template_loop: str
    ) -> list[lipsync_pb2.AudioWindow]:
        """The job's whisper windows (of its `windows`) that the segment's frames with a face read
        (SubmitJob stored them, services.jobs.layout.whisper_key); CorruptRecord when one is missing or
        malformed, as for the mel windows."""
        meta = avatar.meta
        frames = [
            i
            for i in range(task.start_frame, task.end_frame)
            if meta.boxes[loop_frame(i, meta.frame_count, template_loop)] is not None
        ]
        out = []
        for k in windows_read(frames, job.fps, windows):
            key = whisper_key(job.id, k)
            try:
                window = lipsync_pb2.AudioWindow.FromString(await asyncio.to_thread(self.blobs.get, key))
            except NotFound as exc:
                raise CorruptRecord(
                    f"segment {task.index} of job {job.id} cannot render: its whisper window ({key}) is missing from the blob store"
                ) from exc
            except DecodeError as exc:
                raise CorruptRecord(
                    f"segment {task.index} of job {job.id} cannot render: its whisper window ({key}) is damaged"
                ) from exc
            if window.window_index != k:
                raise CorruptRecord(f"job {job.id}: the whisper window stored as {key} is window {window.window_index}")
            out.append(window)
        return out

    async def _join(self, task: Task, job: Job) -> None:
        t0 = time.perf_counter()
        folder = Path(tempfile.mkdtemp(prefix=f"join-{job.id}-", dir=self._scratch))
        try:
            parts = []
            for k in segment_indices(job.segments_total):
                path = folder / f"{k:05d}.mp4"
                await asyncio.to_thread(self.blobs.get_file, segment_key(job.id, k), path)
                parts.append(path)
            audio = folder / "audio.m4a"
            await asyncio.to_thread(self.blobs.get_file, audio_key(job.id), audio)
            output = folder / "output.mp4"
            frames = await asyncio.to_thread(join_segments, parts, output, job.fps, audio)
            if frames != job.total_frames:
                raise RuntimeError(f"joined {frames} frames, the job has {job.total_frames}")
            key = output_key(job.id)
            size = output.stat().st_size
            digest = await asyncio.to_thread(file_sha256, output)  # DownloadOutput checks what it serves against it
            await self._store(key, output)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if not await asyncio.to_thread(
            self.jobs.complete_join, task, key, size, {"join": time.perf_counter() - t0}, digest, self.output_ttl_s
        ):
            raise LeaseLost()
        m = self.metrics
        m.jobs.labels("succeeded").inc()
        done = await asyncio.to_thread(self.jobs.get_job, job.id)
        elapsed = max(1e-6, done.finish_time - done.create_time)
        m.job_seconds.observe(elapsed)
        m.job_realtime_factor.observe(done.audio_seconds / elapsed)
        record_job_span(
            job.id,
            job.trace_context,
            done.create_time,
            "succeeded",
            frames=frames,
            audio_seconds=done.audio_seconds,
            segments=done.segments_total,
        )
        try:
            await asyncio.to_thread(self.blobs.delete_prefix, job_prefix(job.id))
        except Exception:
            _LOGGER.warning("could not delete a finished job's working blobs", exc_info=True, extra={"job_id": job.id})
        _LOGGER.info("job succeeded", extra={"job_id": job.id, "frames": frames, "seconds": round(elapsed, 3)})
