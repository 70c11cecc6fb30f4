"""CreateSession, GetSession and CloseSession without the protos' plumbing: a live session's request
resolved against its avatar and the deployment's limits, its row in the job store, its placement.

What a session is (docs/architecture.md, "Live sessions"): the client's speech streamed in, the
avatar's face streamed out in real time, by one live worker that holds it. The gateway resolves
everything the worker needs once, here (the output size from the avatar, the frame rate, the codec's
quality, the limits), stores the resolved `lipline.v1.Session` in the session's row, and places it
(services.gateway.live_workers). The resume token is made here and returned once: only its sha256
is stored, so a database dump cannot resume anyone's session.

The servicer decodes a CreateSessionRequest into a `SessionRequest`, calls `create_session`, and
turns what it returns into the response (`session_to_proto`), as SubmitJob does with submit.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import logging
import math
import secrets
import time
import uuid
from typing import cast

from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp

from lipline.v1 import session_pb2
from services.gateway.live_workers import LiveWorkers
from services.gateway.settings import GatewaySettings
from services.jobs.store.jobs import AvatarRecord, JobStore
from services.jobs.store.sessions import CLOCK_SLACK_S, SessionRow
from services.serving.errors import CorruptRecord, FailedPrecondition, InvalidRequest, NotFound, PermissionDenied

_LOGGER = logging.getLogger(__name__)

SAMPLE_RATES = (16000, 24000, 48000)
DEFAULT_SAMPLE_RATE = 16000
CODECS = (session_pb2.VIDEO_CODEC_H264, session_pb2.VIDEO_CODEC_JPEG)
DEFAULT_CRF = 23
DEFAULT_JPEG_QUALITY = 85
MIN_HEIGHT = 32  # a smaller max_height leaves the face too few pixels to show a mouth
MAX_FPS = 60.0
MAX_ID_CHARS = 64
TOKEN_BYTES = 32  # secrets.token_urlsafe: 43 characters


@dataclasses.dataclass(frozen=True)
class SessionRequest:
    """A CreateSession request, decoded: only the fields this lipline knows (0 = "the default")."""

    avatar_id: str
    sample_rate: int
    codec: int
    max_height: int
    fps: float
    crf: int
    jpeg_quality: int
    super_resolution: bool
    max_session_seconds: float
    idle_timeout_seconds: float

    @classmethod
    def from_proto(cls, request: session_pb2.CreateSessionRequest) -> SessionRequest:
        return cls(
            avatar_id=request.avatar_id,
            sample_rate=request.audio.sample_rate,
            codec=request.video.codec,
            max_height=request.video.max_height,
            fps=request.video.fps,
            crf=request.video.crf,
            jpeg_quality=request.video.jpeg_quality,
            super_resolution=request.super_resolution,
            max_session_seconds=request.limits.max_session_seconds,
            idle_timeout_seconds=request.limits.idle_timeout_seconds,
        )


def output_size(width: int, height: int, max_height: int) -> tuple[int, int]:
    """The frames' size: the avatar's, or scaled down (aspect kept) to at most `max_height` rows; both
    sides even (H.264 in 4:2:0 needs them so), the width the nearest even number to the aspect's,
    neither ever more than the avatar's."""
    rows = max(2, (height if not max_height or max_height >= height else max_height) // 2 * 2)
    cols = min(round(width * rows / height / 2) * 2, width // 2 * 2)
    return max(2, cols), rows


def resolve_session(
    request: SessionRequest, avatar: AvatarRecord, settings: GatewaySettings, session_id: str
) -> session_pb2.Session:
    """The session as its live worker runs it: every default filled in, every range checked
    (InvalidRequest naming the field and what it may be)."""
    s = settings
    rate = request.sample_rate or DEFAULT_SAMPLE_RATE
    if rate not in SAMPLE_RATES:
        raise InvalidRequest(
            f"audio.sample_rate {rate} is not one of {', '.join(map(str, SAMPLE_RATES))} (PCM s16le mono)"
        )
    codec = request.codec or session_pb2.VIDEO_CODEC_H264
    if codec not in CODECS:
        raise InvalidRequest(f"video.codec {codec} is not one of VIDEO_CODEC_H264 (1) or VIDEO_CODEC_JPEG (2)")
    if request.max_height and request.max_height < MIN_HEIGHT:
        raise InvalidRequest(
            f"video.max_height {request.max_height} is below {MIN_HEIGHT}; 0 keeps the avatar's size ({avatar.width}x{avatar.height})"
        )
    if request.fps and not 1.0 <= request.fps <= MAX_FPS:
        raise InvalidRequest(
            f"video.fps {request.fps:g} is outside 1..{MAX_FPS:g}; 0 keeps the avatar's ({avatar.fps:g})"
        )
    if request.crf > 51:
        raise InvalidRequest(f"video.crf {request.crf} is outside 0..51")
    if request.jpeg_quality > 100:
        raise InvalidRequest(f"video.jpeg_quality {request.jpeg_quality} is outside 1..100")
    limit = request.max_session_seconds or s.max_session_seconds
    if not 0 < limit <= s.max_session_seconds:
        raise InvalidRequest(
            f"limits.max_session_seconds {limit:g} is outside 0..{s.max_session_seconds:g} (this deployment's limit; 0 = that limit)"
        )
    idle = request.idle_timeout_seconds or s.session_idle_timeout_s
    if not 0 < idle <= s.session_idle_timeout_s:
        raise InvalidRequest(
            f"limits.idle_timeout_seconds {idle:g} is outside 0..{s.session_idle_timeout_s:g} (this deployment's limit; 0 = that limit)"
        )
    width, height = output_size(avatar.width, avatar.height, request.max_height)
    return session_pb2.Session(
        id=session_id,
        avatar_id=avatar.id,
        state=session_pb2.SESSION_STATE_ACTIVE,
        audio=session_pb2.AudioFormat(sample_rate=rate),
        video=session_pb2.VideoFormat(
            codec=cast("session_pb2.VideoCodec", codec),
            max_height=request.max_height,
            fps=request.fps or avatar.fps,
            crf=request.crf or DEFAULT_CRF,
            jpeg_quality=request.jpeg_quality or DEFAULT_JPEG_QUALITY,
        ),
        width=width,
        height=height,
        super_resolution=request.super_resolution,
        limits=session_pb2.SessionLimits(max_session_seconds=limit, idle_timeout_seconds=idle),
        model=avatar.model,
    )


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, stored_sha256: str) -> bool:
    """Whether `token` is the session's (its sha256 compared in constant time)."""
    return hmac.compare_digest(token_sha256(token), stored_sha256)


def check_session_id(session_id: str) -> None:
    """NOT_FOUND, without a store read, for what cannot be a session id (1..64 ASCII letters and digits)."""
    if not (0 < len(session_id) <= MAX_ID_CHARS and session_id.isascii() and session_id.isalnum()):
        raise NotFound(f"session {session_id[:MAX_ID_CHARS]!r} does not exist")


def session_to_proto(row: SessionRow, resume_token: str = "") -> session_pb2.Session:
    """The public view: the resolved Session as stored, with the row's state, error and times."""
    try:
        session = session_pb2.Session.FromString(row.session)
    except DecodeError as exc:
        raise CorruptRecord(f"session {row.id!r} has a record this lipline cannot read (not a Session: {exc})") from exc
    created = Timestamp()
    created.FromNanoseconds(int(row.create_time * 1e9))
    session.create_time.CopyFrom(created)
    session.state = cast(session_pb2.SessionState, int(row.state))
    session.error, session.error_code = row.error, row.error_code
    session.resume_token = resume_token
    return session


def require_active(row: SessionRow) -> None:
    """FAILED_PRECONDITION, saying why it ended, for a session that has."""
    if not row.active:
        state = session_pb2.SessionState.Name(int(row.state))
        raise FailedPrecondition(f"session {row.id} is {state}: {row.error or 'it has ended'}; create a new one")


def check_last_frame(row: SessionRow, last_frame: int, now: float | None = None) -> None:
    """InvalidRequest for a ConverseStart's `last_frame` the session cannot have sent: below -1 (none),
    or past the frame its clock has reached. The clock is the session's, wherever it runs: frame k is
    due k / fps after its create_time (services/live/clock.py), with CLOCK_SLACK_S for the machines'
    clocks. Checked here, before a resume could place the session on another worker."""
    fps = session_to_proto(row).video.fps or 25.0
    latest = math.floor(((time.time() if now is None else now) - row.create_time + CLOCK_SLACK_S) * fps)
    if last_frame < -1 or last_frame > latest:
        raise InvalidRequest(
            f"last_frame {last_frame} is not a frame session {row.id} has sent (its clock is at frame "
            f"{max(0, latest - math.floor(CLOCK_SLACK_S * fps))} at {fps:g} fps since it started): send the index "
            "of the last frame received, or -1 for none"
        )


async def stream_session(jobs: JobStore, tenant: str, session_id: str, resume_token: str) -> SessionRow:
    """The session a Converse stream asks for: the tenant's (NotFound otherwise), with this token
    (PermissionDenied otherwise), still ACTIVE (FailedPrecondition otherwise)."""
    check_session_id(session_id)
    row = await jobs.get_session(tenant, session_id)
    if not token_matches(resume_token, row.resume_token_sha256):
        raise PermissionDenied(
            f"the resume token does not match session {session_id}: send the one CreateSession returned"
        )
    require_active(row)
    return row


async def create_session(
    jobs: JobStore,
    workers: LiveWorkers,
    settings: GatewaySettings,
    request: SessionRequest,
    tenant: str,
    request_id: str = "",
) -> tuple[SessionRow, str]:
    """A new session, placed on a live worker: the tenant's avatar (NotFound otherwise), the request
    resolved (InvalidRequest), the row stored (the avatar checked again in its transaction; TooLarge
    over the tenant's cap), then OpenSession on the live worker with the most room (NoCapacity, with
    a retry-after hint, when none has any: the row is removed). Returns the row and the resume token."""
    avatar = await asyncio.to_thread(jobs.get_avatar, request.avatar_id, tenant)
    session_id = uuid.uuid4().hex[:20]
    session = resolve_session(request, avatar, settings, session_id)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    row = await jobs.create_session(
        tenant,
        session_id,
        avatar.id,
        session.SerializeToString(),
        token_sha256(token),
        max_seconds=session.limits.max_session_seconds,
        idle_timeout_s=session.limits.idle_timeout_seconds,
        max_per_tenant=settings.max_sessions_per_tenant,
    )
    try:
        worker = await workers.place(session_to_proto(row), tenant, resume=False, request_id=request_id)
    except BaseException:
        await asyncio.shield(jobs.delete_session(tenant, session_id))
        raise
    _LOGGER.info(
        "session created",
        extra={
            "session_id": session_id,
            "avatar_id": avatar.id,
            "worker": worker.id,
            "size": f"{session.width}x{session.height}",
            "request_id": request_id,
        },
    )
    return await jobs.get_session(tenant, session_id), token


async def close_session(
    jobs: JobStore, workers: LiveWorkers, tenant: str, session_id: str, request_id: str = ""
) -> SessionRow:
    """CLOSED: its worker told first (it frees the slot and ends the stream), then the row marked,
    whether or not the worker answered (a gone worker's session must end too)."""
    check_session_id(session_id)
    row = await jobs.get_session(tenant, session_id)
    if row.active and row.lease_live and row.worker_address:
        await workers.close_on_worker(row.worker_address, session_id, tenant, request_id)
    return await jobs.close_session(tenant, session_id)
