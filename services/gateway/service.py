"""The gateway: lipline's public gRPC API (avatars, jobs, outputs) and the orchestration of stages."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from lipline.v1 import gateway_pb2, gateway_pb2_grpc
from services.common.audio_decode import decode_audio
from services.common.config import ServiceSettings, _field
from services.common.errors import FailedPrecondition, InvalidMedia, InvalidRequest, LiplineError, NotReady, TooLarge
from services.common.interceptor import REQUEST_ID
from services.common.server import Service
from services.gateway.avatars import Avatar, AvatarStore, avatar_id, build_avatar
from services.gateway.jobs import JobRecord, JobStore
from services.gateway.media import X264_PRESETS, decode_avatar
from services.gateway.pipeline import render
from services.gateway.stages import StageClients, stage_error_message

_LOGGER = logging.getLogger(__name__)
MUX_AUDIO_RATE = 48_000  # AAC in the output; the original audio resampled, mono


@dataclasses.dataclass(frozen=True)
class GatewaySettings(ServiceSettings):
    """Settings of the gateway."""

    port: int = _field(50051, "gRPC port of the public API")
    metrics_port: int = _field(9094, "Prometheus /metrics HTTP port (0 = any free port, -1 = off)")
    audio_address: str = _field("127.0.0.1:50061", "audio stage (host:port or dns:///name:port)")
    lipsync_address: str = _field("127.0.0.1:50062", "lipsync stage")
    superres_address: str = _field("127.0.0.1:50063", "superres stage")
    data_dir: str = _field("var", "avatar cache folder")
    output_dir: str = _field("outputs", "where finished MP4s are written")
    max_audio_bytes: int = _field(50 * 1024 * 1024, "largest audio file of a job")
    max_audio_seconds: float = _field(600.0, "longest audio of a job")
    max_avatar_bytes: int = _field(200 * 1024 * 1024, "largest avatar upload")
    max_avatar_frames: int = _field(1500, "most frames of an avatar video (60 s at 25 fps)")
    max_avatar_pixels: int = _field(1920 * 1080, "largest avatar frame size in pixels")
    max_concurrent_jobs: int = _field(4, "jobs rendering at once; more wait in QUEUED")
    max_active_jobs: int = _field(64, "queued + running jobs; more are rejected RESOURCE_EXHAUSTED")
    job_timeout_s: float = _field(3600.0, "a job running longer than this fails DEADLINE_EXCEEDED")
    stage_wait_s: float = _field(60.0, "at start-up, how long to wait for the stages to be SERVING")
    encoder_segments: int = _field(4, "most parts of a clip encoded in parallel (x264 instances, joined by a stream copy)")
    encoder_segment_min_s: float = _field(4.0, "shortest part in seconds of video (each part starts with a keyframe)")
    x264_preset: str = _field(
        "veryfast", "x264 speed preset of the output (ultrafast ... veryslow): faster presets cost file size, not quality at a given crf"
    )

    def validate(self) -> None:
        super().validate()
        problems = []
        if self.encoder_segments < 1:
            problems.append(f"encoder_segments must be >= 1, got {self.encoder_segments}")
        if self.encoder_segment_min_s <= 0:
            problems.append(f"encoder_segment_min_s must be > 0, got {self.encoder_segment_min_s}")
        if self.x264_preset not in X264_PRESETS:
            problems.append(f"x264_preset {self.x264_preset!r} is not one of {', '.join(X264_PRESETS)}")
        if problems:
            raise ValueError("; ".join(problems))


def _avatar_proto(avatar: Avatar) -> gateway_pb2.Avatar:
    created = Timestamp()
    created.FromNanoseconds(int(avatar.create_time * 1e9))
    _, h, w = avatar.frames.shape[:3]
    return gateway_pb2.Avatar(
        id=avatar.id, name=avatar.name, frame_count=avatar.frame_count, fps=avatar.fps,
        width=w, height=h, faces_found=avatar.faces_found, create_time=created,
    )


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, service: GatewayService) -> None:
        self._svc = service

    # -- avatars ------------------------------------------------------------------------------

    async def CreateAvatar(
        self, request_iterator: AsyncIterator[gateway_pb2.CreateAvatarRequest], context: grpc.aio.ServicerContext
    ) -> gateway_pb2.Avatar:
        s = self._svc.settings
        name, photo_fps, chunks, size = "", 0.0, [], 0
        async for request in request_iterator:
            name = name or request.name
            photo_fps = photo_fps or request.photo_fps
            size += len(request.data)
            if size > s.max_avatar_bytes:
                raise TooLarge(f"avatar upload is over {s.max_avatar_bytes} bytes")
            chunks.append(request.data)
        photo_fps = photo_fps or 25.0
        if not 1.0 <= photo_fps <= 60.0:
            raise InvalidRequest(f"photo_fps {photo_fps} is outside 1..60")
        data = b"".join(chunks)
        if not data:
            raise InvalidMedia("avatar is empty: send the bytes of a photo or a video")
        aid = avatar_id(data, photo_fps)
        store = self._svc.avatars
        if store.exists(aid):
            return _avatar_proto(await asyncio.to_thread(store.get, aid))
        frames, fps = await asyncio.to_thread(
            decode_avatar, data, photo_fps=photo_fps, max_frames=s.max_avatar_frames, max_pixels=s.max_avatar_pixels
        )
        try:
            boxes = await self._svc.clients.detect_faces(frames, REQUEST_ID.get())
        except grpc.aio.AioRpcError as exc:
            raise NotReady(stage_error_message("lipsync", exc)) from exc
        if not any(b is not None for b in boxes):
            raise InvalidMedia(
                "no face found in the avatar; use a photo or video with one frontal, well-lit face "
                "covering at least 10% of the picture"
            )
        avatar = await asyncio.to_thread(build_avatar, aid, name, frames, fps, boxes)
        await asyncio.to_thread(store.save, avatar)
        _LOGGER.info("avatar created", extra={"avatar_id": aid, "frames": len(frames), "faces": avatar.faces_found})
        return _avatar_proto(avatar)

    async def GetAvatar(self, request: gateway_pb2.GetAvatarRequest, context: grpc.aio.ServicerContext) -> gateway_pb2.Avatar:
        return _avatar_proto(await asyncio.to_thread(self._svc.avatars.get, request.avatar_id))

    async def ListAvatars(
        self, request: gateway_pb2.ListAvatarsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ListAvatarsResponse:
        avatars = await asyncio.to_thread(self._svc.avatars.list)
        return gateway_pb2.ListAvatarsResponse(avatars=[_avatar_proto(a) for a in avatars])

    async def DeleteAvatar(
        self, request: gateway_pb2.DeleteAvatarRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.DeleteAvatarResponse:
        await asyncio.to_thread(self._svc.avatars.delete, request.avatar_id)
        return gateway_pb2.DeleteAvatarResponse()

    # -- jobs -----------------------------------------------------------------------------------

    async def SubmitJob(self, request: gateway_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext) -> gateway_pb2.Job:
        s = self._svc.settings
        if len(request.audio) > s.max_audio_bytes:
            raise TooLarge(f"audio is {len(request.audio)} bytes; the limit is {s.max_audio_bytes}")
        if request.options.crf > 51:
            raise InvalidRequest(f"crf {request.options.crf} is outside 0..51")
        avatar = await asyncio.to_thread(self._svc.avatars.get, request.avatar_id)
        # Decoding here (we need the PCM for the AAC track anyway) rejects bad audio before the job exists.
        decode_started = time.perf_counter()
        pcm = await asyncio.to_thread(decode_audio, request.audio, MUX_AUDIO_RATE, s.max_audio_seconds)
        decode_seconds = time.perf_counter() - decode_started
        job = self._svc.jobs.create(avatar.id, request.options, len(pcm) / MUX_AUDIO_RATE)
        job.stage_seconds["audio_decode"] = decode_seconds
        job.task = asyncio.create_task(self._svc.run_job(job, avatar, request.audio, pcm, REQUEST_ID.get()))
        _LOGGER.info("job submitted", extra={"job_id": job.id, "avatar_id": avatar.id, "audio_s": round(job.audio_seconds, 3)})
        return job.to_proto()

    async def GetJob(self, request: gateway_pb2.GetJobRequest, context: grpc.aio.ServicerContext) -> gateway_pb2.Job:
        return self._svc.jobs.get(request.job_id).to_proto()

    async def CancelJob(self, request: gateway_pb2.CancelJobRequest, context: grpc.aio.ServicerContext) -> gateway_pb2.Job:
        job = self._svc.jobs.get(request.job_id)
        if not job.terminal and job.task is not None:
            job.task.cancel()
            try:
                await job.task
            except asyncio.CancelledError:
                pass
        return job.to_proto()

    async def WatchJob(
        self, request: gateway_pb2.WatchJobRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.JobEvent]:
        job = self._svc.jobs.get(request.job_id)
        while True:
            yield gateway_pb2.JobEvent(job=job.to_proto())
            if job.terminal:
                return
            await job.wait_change(timeout=5.0)  # also a heartbeat for long stages

    async def DownloadOutput(
        self, request: gateway_pb2.DownloadOutputRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.DownloadOutputResponse]:
        job = self._svc.jobs.get(request.job_id)
        if job.state != gateway_pb2.JOB_STATE_SUCCEEDED or job.output_path is None:
            raise FailedPrecondition(
                f"job {job.id} is {gateway_pb2.JobState.Name(job.state)}; its output exists once it has SUCCEEDED"
            )
        chunk = min(request.chunk_bytes or 1 << 20, self._svc.settings.max_message_bytes // 2)
        total = job.output_path.stat().st_size
        with job.output_path.open("rb") as f:
            first = True
            while data := await asyncio.to_thread(f.read, chunk):
                response = gateway_pb2.DownloadOutputResponse(data=data)
                if first:
                    response.total_bytes = total
                    first = False
                yield response


class GatewayService(Service[GatewaySettings]):
    stage = "gateway"

    @property
    def service_names(self) -> Sequence[str]:
        return [gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name]

    def register(self, server: grpc.aio.Server) -> None:
        s = self.settings
        self.avatars = AvatarStore(Path(s.data_dir))
        self.jobs = JobStore(max_active=s.max_active_jobs)
        self.output_dir = Path(s.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._slots: asyncio.Semaphore | None = None
        gateway_pb2_grpc.add_GatewayServicer_to_server(GatewayServicer(self), server)

    async def load(self) -> None:
        s = self.settings
        self.clients = StageClients(s.audio_address, s.lipsync_address, s.superres_address, s.max_message_bytes)
        self._slots = asyncio.Semaphore(s.max_concurrent_jobs)
        deadline = time.monotonic() + s.stage_wait_s
        for stage in ("audio", "lipsync", "superres"):
            while not await self.clients.check(stage):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{stage} stage at {self.clients.addresses[stage]} is not SERVING")
                await asyncio.sleep(0.2)
        _LOGGER.info("all stages SERVING", extra=self.clients.addresses)

    async def close(self) -> None:
        for job in self.jobs.active():
            if job.task is not None:
                job.task.cancel()
        if hasattr(self, "clients"):
            await self.clients.close()

    async def run_job(self, job: JobRecord, avatar: Avatar, audio: bytes, pcm, request_id: str) -> None:
        m = self.metrics
        assert self._slots is not None
        output = self.output_dir / f"{job.id}.mp4"

        def on_progress(stage: str, done: int, total: int) -> None:
            job.stage, job.frames_done, job.total_frames = stage, done, total
            job.notify()

        try:
            async with self._slots:
                job.state, job.stage, job.started = gateway_pb2.JOB_STATE_RUNNING, "audio", time.time()
                job.notify()
                result = await asyncio.wait_for(
                    render(
                        self.clients, avatar, audio, pcm, MUX_AUDIO_RATE, output,
                        job.options.super_resolution, job.options.crf or 20, on_progress, request_id,
                        job.stage_seconds, preset=self.settings.x264_preset, segments=self.settings.encoder_segments,
                        min_segment_frames=max(1, round(self.settings.encoder_segment_min_s * avatar.fps)),
                    ),
                    self.settings.job_timeout_s,
                )
            job.models = result.models
            job.output_path, job.output_bytes = output, output.stat().st_size
            job.frames_done = job.total_frames = result.frames
            job.state, job.stage = gateway_pb2.JOB_STATE_SUCCEEDED, "done"
            m.render_first_frame_seconds.observe(result.first_frame_seconds)
        except asyncio.CancelledError:
            job.state, job.stage, job.error = gateway_pb2.JOB_STATE_CANCELLED, "cancelled", "cancelled by request"
            job.error_code = grpc.StatusCode.CANCELLED
        except TimeoutError:
            job.state, job.error_code = gateway_pb2.JOB_STATE_FAILED, grpc.StatusCode.DEADLINE_EXCEEDED
            job.error = f"job ran longer than {self.settings.job_timeout_s} s"
        except LiplineError as exc:
            job.state, job.error, job.error_code = gateway_pb2.JOB_STATE_FAILED, str(exc), exc.code
        except Exception as exc:  # noqa: BLE001 - a job failure must never take the gateway down
            _LOGGER.exception("job crashed", extra={"job_id": job.id})
            job.state, job.error_code = gateway_pb2.JOB_STATE_FAILED, grpc.StatusCode.INTERNAL
            job.error = f"internal error ({type(exc).__name__}); the gateway log has details"
        finally:
            job.finished = time.time()
            status = gateway_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_").lower()
            m.jobs.labels(status).inc()
            if job.state == gateway_pb2.JOB_STATE_SUCCEEDED:
                m.job_seconds.observe(job.elapsed())
                if job.elapsed():
                    m.job_realtime_factor.observe(job.audio_seconds / job.elapsed())
            _LOGGER.info(
                "job finished",
                extra={
                    "job_id": job.id, "state": status, "seconds": round(job.elapsed(), 3), "error": job.error,
                    "stage_seconds": {k: round(v, 3) for k, v in job.stage_seconds.items()},
                },
            )
            job.notify()
