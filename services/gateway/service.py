"""The gateway: lipline's public gRPC API (avatars, jobs, outputs, live sessions). It keeps no state of its own.

Avatars, jobs and outputs live in the job store and the blob store, so any gateway replica answers
any request and a restart loses nothing; render workers do the rendering. The gateway validates,
prepares what every job needs once (the audio checks, mel windows and AAC track) and queues it.

Every request field is bounded before it costs anything: ids that cannot exist (longer than 64
characters, or characters an id never has) are NOT_FOUND without a store read, names are at most
MAX_NAME_CHARS, audio and avatar uploads have byte limits, options have ranges, and responses have a
size bound (list pages at most 1000 rows and half the message limit, DownloadOutput chunks within
DOWNLOAD_CHUNK_*); labels have Kubernetes' rules (services.gateway.labels).
Per client (services.serving.interceptor: the API key's tenant, else the x-api-key metadata or the
IP address) the interceptor caps concurrent calls and SubmitJob caps queued + running jobs.

Tenants: every avatar and job belongs to the caller's tenant (`TENANT`, set by the interceptor), and
every RPC finds only the caller's own; another tenant's id answers NOT_FOUND exactly like an id that
never existed (PERMISSION_DENIED would confirm that it exists). Avatar ids are random; the same
tenant's same upload finds its avatar again through the store's per-tenant content index.

Creates are idempotent with a request_id (services.gateway.request_ids): a retry returns what the
first made. Lists are newest first in pages with signed keyset tokens (services.gateway.lists, .pages).
DeleteJob removes a finished job's blobs, then its row. Outputs expire (services.jobs.retention):
after the deployment's output_ttl_s, DownloadOutput and GetOutputUrl answer FAILED_PRECONDITION
"output expired at ..." and the render workers' janitor deletes the blob.

DeleteAvatar hides the avatar at once and purges its data when no QUEUED or RUNNING job and no live
session uses it (services.gateway.janitor), so jobs submitted before the delete finish.

Inputs and outputs by reference: SubmitJob's audio_uri is fetched by services.gateway.audio_uri
(then checked like uploaded bytes); GetOutputUrl signs an S3 URL of the output (blob stores on S3).

Webhooks (services.gateway.webhooks): a job's callback_url is checked at SubmitJob; every replica
delivers the job store's outbox of ended jobs.

Live sessions (services.gateway.sessions, .converse, .live_workers) are rows in the job store placed
on live workers; the gateway relays each Converse stream to the worker holding its session.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Sequence

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from lipline.v1 import audio_pb2_grpc, gateway_pb2, gateway_pb2_grpc, lipsync_pb2_grpc, session_pb2
from services.gateway.audio_uri import AudioFetcher
from services.gateway.avatars import AvatarUpload, add_avatar, avatar_to_proto
from services.gateway.converse import converse
from services.gateway.janitor import AvatarJanitor, purge_deleted_avatars
from services.gateway.jobs import job_to_proto
from services.gateway.labels import check_labels
from services.gateway.lists import list_avatars, list_jobs
from services.gateway.live_workers import LiveWorkers
from services.gateway.musetalk_avatars import musetalk_preparer
from services.gateway.pages import PAGE_KEY_NAME, PageTokens
from services.gateway.request_ids import check_request_id
from services.gateway.sessions import SessionRequest, check_session_id, close_session, create_session, session_to_proto
from services.gateway.settings import GatewaySettings
from services.gateway.submit import Caller, JobRequest, submit_job
from services.gateway.tiers import check_model, require_served
from services.gateway.webhooks import CallbackRules, WebhookSender, delivery_to_proto
from services.jobs.avatars import is_avatar_id
from services.jobs.integrity import OutputCheck, damaged
from services.jobs.layout import job_prefix, output_key
from services.jobs.retention import expired_message, output_expired, url_expire_time
from services.jobs.store import close_stores, open_stores
from services.jobs.store.jobs import Job, JobState
from services.serving.background import cancel_and_wait
from services.serving.discovery import DiscoveredStageClients, NoAddresses
from services.serving.errors import FailedPrecondition, InvalidMedia, InvalidRequest, NotFound, NotReady, TooLarge
from services.serving.interceptor import CLIENT_ID, REQUEST_ID, TENANT
from services.serving.secret_files import start_watch
from services.serving.server import Service
from services.serving.stages import DEFAULT_TIER
from services.serving.tenants import IMPLICIT_TENANT, parse_webhook_secrets
from services.serving.tracing import context_carrier

_LOGGER = logging.getLogger(__name__)
WATCH_HEARTBEAT_S = 5.0  # WatchJob re-sends the job at least this often (progress of long stages, liveness)
MAX_NAME_CHARS = 256
MAX_ID_CHARS = 64
DOWNLOAD_CHUNK_MIN = 64 * 1024  # smaller chunk_bytes requests are raised to this
DOWNLOAD_CHUNK_DEFAULT = 1 << 20  # chunk_bytes unset
DOWNLOAD_CHUNK_MAX = 1 << 20  # larger requests are lowered to this: a stream blocked on a client
#   that stopped reading holds ~4 copies of a chunk (ours, the message, its serialization, gRPC's), so
#   the gateway's worst case is max_concurrent_streams x 4 MiB


def _check_avatar_id(avatar_id: str) -> None:
    """NOT_FOUND, without a store read, for what cannot be an avatar id (24 lowercase hex digits)."""
    if not is_avatar_id(avatar_id):
        raise NotFound(f"avatar {avatar_id[:MAX_ID_CHARS]!r} does not exist; create it with CreateAvatar")


def _check_job_id(job_id: str) -> None:
    """NOT_FOUND, without a store read, for what cannot be a job id (1..64 ASCII letters and digits)."""
    if not (0 < len(job_id) <= MAX_ID_CHARS and job_id.isascii() and job_id.isalnum()):
        raise NotFound(f"job {job_id[:MAX_ID_CHARS]!r} does not exist")


def _tenant() -> str:
    """The caller's tenant (the interceptor sets it before any handler runs)."""
    tenant = TENANT.get()
    if not tenant:
        raise RuntimeError("a gateway RPC ran without a tenant: the interceptor did not admit it")
    return tenant


def _check_name(name: str) -> None:
    if len(name) > MAX_NAME_CHARS:
        raise InvalidRequest(f"avatar name is {len(name)} characters; the limit is {MAX_NAME_CHARS}")


def download_chunk_bytes(requested: int, max_message_bytes: int) -> int:
    """DownloadOutput's chunk size: `requested` (DOWNLOAD_CHUNK_DEFAULT when 0) kept within
    DOWNLOAD_CHUNK_MIN..DOWNLOAD_CHUNK_MAX (64 KiB..1 MiB) and half the message limit. The floor
    bounds the per-message overhead a client can cause; the ceiling the memory one stream holds."""
    chunk = requested or DOWNLOAD_CHUNK_DEFAULT
    return max(DOWNLOAD_CHUNK_MIN, min(chunk, DOWNLOAD_CHUNK_MAX, max_message_bytes // 2))


async def _avatar_upload(
    request_iterator: AsyncIterator[gateway_pb2.CreateAvatarRequest], max_bytes: int, settings: GatewaySettings
) -> AvatarUpload:
    """CreateAvatar's stream, decoded: the first non-empty name and photo_fps, the first message's
    request_id, labels and model (checked: a tier this deployment does not serve is refused before
    the upload is read), every message's name bounded, the bytes joined (TooLarge past `max_bytes`,
    as soon as the stream crosses it)."""
    name, photo_fps, chunks, size = "", 0.0, [], 0
    request_id, labels, model, first = "", {}, DEFAULT_TIER, True
    async for request in request_iterator:
        if first:
            request_id, labels, first = check_request_id(request.request_id), check_labels(request.labels), False
            model = check_model(request.model)
            require_served(settings, model)
        _check_name(request.name)  # every message's, at once (only the first non-empty one is used)
        name = name or request.name
        photo_fps = photo_fps or request.photo_fps
        size += len(request.data)
        if size > max_bytes:
            raise TooLarge(f"avatar upload is over {max_bytes} bytes")
        if request.data:  # empty messages cost nothing to keep
            chunks.append(request.data)
    photo_fps = photo_fps or 25.0
    if not 1.0 <= photo_fps <= 60.0:
        raise InvalidRequest(f"photo_fps {photo_fps} is outside 1..60")
    data = b"".join(chunks)
    if not data:
        raise InvalidMedia("avatar is empty: send the bytes of a photo or a video")
    return AvatarUpload(data, name, photo_fps, request_id, labels, model)


def _job_request(request: gateway_pb2.SubmitJobRequest, max_audio_bytes: int) -> JobRequest:
    """SubmitJob's request, decoded: its sizes and ranges checked, only the known options kept (an
    audio_uri is kept as sent; its bytes are fetched later, within the same max_audio_bytes)."""
    if len(request.audio) > max_audio_bytes:
        raise TooLarge(f"audio is {len(request.audio)} bytes; the limit is {max_audio_bytes}")
    if request.options.crf > 51:
        raise InvalidRequest(f"crf {request.options.crf} is outside 0..51")
    # Only the known fields are stored (unknown fields of the request would be kept by protobuf).
    options = gateway_pb2.JobOptions(
        super_resolution=request.options.super_resolution,
        crf=request.options.crf,
        loop=request.options.loop,
        callback_url=request.options.callback_url,  # checked by SubmitJob (CallbackRules)
    )
    if options.loop not in gateway_pb2.JobOptions.LoopMode.values():
        raise InvalidRequest(f"loop {options.loop} is not one of PING_PONG (0) or WRAP (1)")
    _check_avatar_id(request.avatar_id)
    return JobRequest(
        request.avatar_id,
        request.audio,
        options.SerializeToString(),
        check_request_id(request.request_id),
        check_labels(request.labels),
        callback_url=options.callback_url,
        audio_uri=request.audio_uri,
    )


def _check_audio_source(request: gateway_pb2.SubmitJobRequest) -> None:
    """Exactly one of audio and audio_uri (an empty upload is the audio stage's INVALID_ARGUMENT, as before)."""
    if request.audio and request.audio_uri:
        raise InvalidRequest("send the audio's bytes (audio) or where to fetch them (audio_uri), not both")


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, service: GatewayService) -> None:
        self._svc = service

    # -- avatars ------------------------------------------------------------------------------

    async def CreateAvatar(
        self, request_iterator: AsyncIterator[gateway_pb2.CreateAvatarRequest], context: grpc.aio.ServicerContext
    ) -> gateway_pb2.Avatar:
        svc = self._svc
        upload = await _avatar_upload(request_iterator, svc.settings.max_avatar_bytes, svc.settings)
        prepare = musetalk_preparer(svc.musetalk) if upload.model == "musetalk" else None
        record = await add_avatar(
            svc.jobs, svc.blobs, svc.lipsync, svc.settings, upload, _tenant(), REQUEST_ID.get(), prepare=prepare
        )
        return avatar_to_proto(record)

    async def GetAvatar(
        self, request: gateway_pb2.GetAvatarRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.Avatar:
        _check_avatar_id(request.avatar_id)
        return avatar_to_proto(await asyncio.to_thread(self._svc.jobs.get_avatar, request.avatar_id, _tenant()))

    async def ListAvatars(
        self, request: gateway_pb2.ListAvatarsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ListAvatarsResponse:
        """A page of the caller's avatars, newest first (services.gateway.lists)."""
        svc = self._svc
        return await list_avatars(svc.jobs, svc.pages, _tenant(), request, svc.settings.max_message_bytes)

    async def DeleteAvatar(
        self, request: gateway_pb2.DeleteAvatarRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.DeleteAvatarResponse:
        """Gone for the tenant at once; its data is purged now if no QUEUED or RUNNING job uses it,
        else by the janitor once they have finished (they keep rendering from it)."""
        svc = self._svc
        _check_avatar_id(request.avatar_id)
        await asyncio.to_thread(svc.jobs.delete_avatar, request.avatar_id, _tenant())
        try:
            await asyncio.to_thread(purge_deleted_avatars, svc.jobs, svc.blobs, request.avatar_id)
        except Exception as exc:  # noqa: BLE001 - the avatar is deleted; the janitor purges it later
            _LOGGER.warning("DeleteAvatar: purging %s now failed (%s); the janitor retries", request.avatar_id, exc)
        return gateway_pb2.DeleteAvatarResponse()

    # -- jobs -----------------------------------------------------------------------------------

    async def SubmitJob(
        self, request: gateway_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.Job:
        svc = self._svc
        _check_audio_source(request)
        job_request = _job_request(request, svc.settings.max_audio_bytes)
        if request.options.callback_url:
            svc.callback_rules.check(request.options.callback_url, _tenant())
        fetch_audio = None
        if request.audio_uri:  # checked now (no I/O); fetched by submit_job after the request-id lookup
            fetch_audio = functools.partial(svc.audio_fetcher.fetch, svc.audio_fetcher.check(request.audio_uri))
        caller = Caller(_tenant(), CLIENT_ID.get(), REQUEST_ID.get(), context_carrier())
        job = await submit_job(svc.jobs, svc.blobs, svc.audio, svc.settings, job_request, caller, fetch_audio)
        return self._job(job)

    async def GetJob(self, request: gateway_pb2.GetJobRequest, context: grpc.aio.ServicerContext) -> gateway_pb2.Job:
        _check_job_id(request.job_id)
        job = self._job(await asyncio.to_thread(self._svc.jobs.get_job, request.job_id, _tenant()))
        if job.options.callback_url:
            job.webhook.CopyFrom(delivery_to_proto(await asyncio.to_thread(self._svc.jobs.get_delivery, job.id)))
        return job

    async def CancelJob(
        self, request: gateway_pb2.CancelJobRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.Job:
        svc = self._svc
        _check_job_id(request.job_id)
        tenant = _tenant()
        before = await asyncio.to_thread(svc.jobs.get_job, request.job_id, tenant)
        job = await asyncio.to_thread(svc.jobs.cancel_job, request.job_id, tenant)
        if not before.terminal and job.state == JobState.CANCELLED:
            svc.metrics.jobs.labels("cancelled").inc()
            # Workers drop their work within a heartbeat; one that stored a segment meanwhile deletes it.
            await asyncio.to_thread(svc.blobs.delete_prefix, job_prefix(job.id))
            _LOGGER.info("job cancelled", extra={"job_id": job.id})
        return self._job(job)

    async def ListJobs(
        self, request: gateway_pb2.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ListJobsResponse:
        """A page of the caller's jobs, newest first, filtered (services.gateway.lists)."""
        svc = self._svc
        return await list_jobs(
            svc.jobs, svc.pages, _tenant(), request, svc.settings.max_message_bytes, svc.settings.output_ttl_s
        )

    async def DeleteJob(
        self, request: gateway_pb2.DeleteJobRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.DeleteJobResponse:
        """A finished job's blobs (its upload, mels, segments and output), then its row. Blobs first:
        a gateway that dies between the two leaves a job whose DeleteJob can be sent again, never
        files that no row leads to. FAILED_PRECONDITION for a queued or running job, before anything
        is deleted (its workers would write more)."""
        svc = self._svc
        _check_job_id(request.job_id)
        tenant = _tenant()
        job = await asyncio.to_thread(svc.jobs.get_job, request.job_id, tenant)
        if not job.terminal:
            raise FailedPrecondition(
                f"job {job.id} is {gateway_pb2.JobState.Name(int(job.state))}; cancel it first (CancelJob), then delete it"
            )
        await asyncio.to_thread(svc.blobs.delete_prefix, job_prefix(job.id))
        await asyncio.to_thread(svc.blobs.delete, output_key(job.id))
        await asyncio.to_thread(svc.jobs.delete_job, job.id, tenant)
        _LOGGER.info("job deleted", extra={"job_id": job.id})
        return gateway_pb2.DeleteJobResponse()

    async def WatchJob(
        self, request: gateway_pb2.WatchJobRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.JobEvent]:
        svc = self._svc
        _check_job_id(request.job_id)
        tenant = _tenant()
        job = await asyncio.to_thread(svc.jobs.get_job, request.job_id, tenant)
        while True:
            yield gateway_pb2.JobEvent(job=self._job(job))
            if job.terminal:
                return
            await svc.feed.wait(job.id, job.version, WATCH_HEARTBEAT_S)
            job = await asyncio.to_thread(svc.jobs.get_job, job.id, tenant)

    async def DownloadOutput(
        self, request: gateway_pb2.DownloadOutputRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.DownloadOutputResponse]:
        """The MP4 in chunks of `chunk_bytes` (see download_chunk_bytes: 1 MiB when unset, within
        64 KiB..1 MiB). A chunk is read from the blob store only once gRPC has taken the previous
        one, and gRPC takes no more while the client's HTTP/2 flow-control window is full, so a
        client that stops reading holds a few chunks of the gateway's memory (~4 MiB), however large
        the output (tests/integration/test_fairness.py measures it).

        Integrity (services.jobs.integrity): a stored size other than the job's output_bytes ends
        the call DATA_LOSS before the first chunk; bytes whose sha256 differs from the one the join
        recorded end it DATA_LOSS after the last (a client must discard what it got)."""
        svc = self._svc
        _check_job_id(request.job_id)
        job = await self._output_job(request.job_id)
        chunk = download_chunk_bytes(request.chunk_bytes, svc.settings.max_message_bytes)
        check = OutputCheck(job.id, job.output_bytes, job.output_sha256)
        try:
            check.check_size(await asyncio.to_thread(svc.blobs.size, output_key(job.id)))
            chunks = await asyncio.to_thread(svc.blobs.read_chunks, output_key(job.id), chunk)
        except NotFound:
            raise damaged(job.id, "the output is missing from the blob store") from None
        first = True
        try:
            while (data := await asyncio.to_thread(next, chunks, None)) is not None:
                check.add(data)
                response = gateway_pb2.DownloadOutputResponse(data=data)
                del data  # the message holds its own copy: one copy less per stream while it waits
                if first:
                    response.total_bytes = job.output_bytes
                    first = False
                yield response
            check.finish()  # DATA_LOSS after the last chunk when the bytes were not the recorded output
        finally:  # a cancelled download closes its file (or S3 stream) now, not at garbage collection
            with contextlib.suppress(Exception):  # ValueError if a cancelled read is still running
                getattr(chunks, "close", lambda: None)()

    def _job(self, job: Job) -> gateway_pb2.Job:
        return job_to_proto(job, output_ttl_s=self._svc.settings.output_ttl_s)

    async def _output_job(self, job_id: str) -> Job:
        """The caller's job, if its output can be read now: FAILED_PRECONDITION before it has
        SUCCEEDED and once its output has expired (services.jobs.retention)."""
        svc = self._svc
        job = await asyncio.to_thread(svc.jobs.get_job, job_id, _tenant())
        if job.state != JobState.SUCCEEDED:
            raise FailedPrecondition(
                f"job {job.id} is {gateway_pb2.JobState.Name(int(job.state))}; its output exists once it has SUCCEEDED"
            )
        if output_expired(job, svc.settings.output_ttl_s, time.time()):
            raise FailedPrecondition(expired_message(job, svc.settings.output_ttl_s))
        return job

    async def GetOutputUrl(
        self, request: gateway_pb2.GetOutputUrlRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.GetOutputUrlResponse:
        """A presigned URL of the output (signed locally: no blob store call), for the caller's own
        SUCCEEDED job, working until output_url_ttl_s from now or the output's expiry, whichever is
        first; FAILED_PRECONDITION before that, after the output expired and on a blob store without
        such URLs."""
        svc = self._svc
        _check_job_id(request.job_id)
        job = await self._output_job(request.job_id)
        now = time.time()
        expires = url_expire_time(job, svc.settings.output_ttl_s, svc.settings.output_url_ttl_s, now)
        ttl = max(1.0, expires - now)
        url = await asyncio.to_thread(svc.blobs.presigned_url, output_key(job.id), ttl)
        if url is None:
            raise FailedPrecondition(
                "this gateway's blob store is a folder, which has no download URLs (they need S3); use DownloadOutput"
            )
        expire_time = Timestamp()
        expire_time.FromNanoseconds(int(expires * 1e9))
        return gateway_pb2.GetOutputUrlResponse(url=url, expire_time=expire_time)

    # -- live sessions --------------------------------------------------------------------------

    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        svc = self._svc
        _check_avatar_id(request.avatar_id)
        row, token = await create_session(
            svc.jobs, svc.live, svc.settings, SessionRequest.from_proto(request), _tenant(), REQUEST_ID.get()
        )
        return session_to_proto(row, resume_token=token)

    async def Converse(
        self, request_iterator: AsyncIterator[session_pb2.ConverseRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[session_pb2.ConverseResponse]:
        async for response in converse(self._svc.jobs, self._svc.live, request_iterator, _tenant(), REQUEST_ID.get()):
            yield response

    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        check_session_id(request.session_id)
        return session_to_proto(await self._svc.jobs.get_session(_tenant(), request.session_id))

    async def CloseSession(
        self, request: session_pb2.CloseSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        svc = self._svc
        return session_to_proto(
            await close_session(svc.jobs, svc.live, _tenant(), request.session_id, REQUEST_ID.get())
        )


class GatewayService(Service[GatewaySettings]):
    stage = "gateway"

    @property
    def service_names(self) -> Sequence[str]:
        return [gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name]

    def register(self, server: grpc.aio.Server) -> None:
        gateway_pb2_grpc.add_GatewayServicer_to_server(GatewayServicer(self), server)

    async def load(self) -> None:
        s = self.settings
        self.callback_rules = CallbackRules(s)  # first: a bad secrets file stops the start-up
        self.jobs, self.blobs = await open_stores(s)
        self.feed = self.jobs.change_feed()
        await self.feed.start()
        if not s.api_keys_file:
            _LOGGER.warning(
                "API keys are off (no api_keys_file): the public API is open to anyone who can reach its port, "
                "and every caller is the one tenant %r; set api_keys_file to give each client its own tenant",
                IMPLICIT_TENANT,
            )
        self.live = LiveWorkers(
            self.jobs, s.max_message_bytes, s.live_worker_fresh_s, s.live_open_timeout_s, s.session_retry_after_ms
        )
        self.pages = PageTokens(await asyncio.to_thread(self.jobs.shared_key, PAGE_KEY_NAME))
        self.janitor = AvatarJanitor(self.jobs, self.blobs, s.avatar_purge_interval_s, s.request_id_window_s)
        self.janitor.start()
        self.audio_fetcher = AudioFetcher(s, self.blobs)
        self.webhooks = WebhookSender(self.jobs, self.callback_rules, s, self.metrics)
        self.webhooks.start()
        self.secrets_watch = start_watch(
            s.webhook_secrets_file,
            "webhook secrets file",
            lambda text: parse_webhook_secrets(text, s.webhook_secrets_file),
            self.callback_rules.use_secrets,
            s.secrets_reload_s,
            self.metrics,
            "webhook_secrets",
        )
        # Each stage's channel follows its replicas (k8s:///, file://; static and dns:/// as before). A
        # tier's optional stage (lipsync-musetalk) is not waited for: only its CreateAvatars need it.
        addresses = {"audio": s.audio_address, "lipsync": s.lipsync_address}
        if s.lipsync_musetalk_address:
            addresses["lipsync-musetalk"] = s.lipsync_musetalk_address
        self.clients = DiscoveredStageClients(addresses, s.max_message_bytes)
        await self.clients.start()
        await self.clients.wait_serving(s.stage_wait_s, stages=("audio", "lipsync"))

    @property
    def audio(self) -> audio_pb2_grpc.AudioServiceStub:
        """A stub on the audio stage's current channel: one per call, never kept."""
        return self.clients.stub("audio", audio_pb2_grpc.AudioServiceStub)

    @property
    def lipsync(self) -> lipsync_pb2_grpc.LipSyncServiceStub:
        """A stub on the lipsync stage's current channel: one per call, never kept."""
        return self.clients.stub("lipsync", lipsync_pb2_grpc.LipSyncServiceStub)

    @property
    def musetalk(self) -> lipsync_pb2_grpc.MuseTalkServiceStub:
        """A stub on the lipsync-musetalk stage's current channel: FAILED_PRECONDITION where it is not
        deployed, UNAVAILABLE (try again) while it is but no replica has been found yet."""
        require_served(self.settings, "musetalk")
        try:
            return self.clients.stub("lipsync-musetalk", lipsync_pb2_grpc.MuseTalkServiceStub)
        except NoAddresses:
            raise NotReady("no lipsync-musetalk replica is ready yet (the musetalk tier's stage); try again") from None

    async def close(self) -> None:
        await cancel_and_wait(getattr(self, "secrets_watch", None))
        if hasattr(self, "janitor"):
            await self.janitor.close()
        if hasattr(self, "webhooks"):
            await self.webhooks.close()
        if hasattr(self, "audio_fetcher"):
            await self.audio_fetcher.close()
        if hasattr(self, "feed"):
            await self.feed.close()
        if hasattr(self, "live"):
            await self.live.close()
        if hasattr(self, "clients"):
            await self.clients.close()
        close_stores(getattr(self, "jobs", None), getattr(self, "blobs", None))
