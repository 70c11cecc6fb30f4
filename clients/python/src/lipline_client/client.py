"""`LiplineClient`: lipline's public gRPC API as typed, synchronous methods, for product backends.

Every method takes `timeout=` (seconds; default the client's `timeout`): it bounds the whole call,
its retries included, and ends it DEADLINE_EXCEEDED. Failures are raised as `grpc.RpcError` (its
`code()` and `details()` say what went wrong); calls are retried as lipline_client.retry says
(UNAVAILABLE for calls that are safe to repeat, RESOURCE_EXHAUSTED when the server says when).

Creates (submit_job, create_avatar) carry a `request_id`, a fresh UUID per call unless given, the
same on each of the call's retries, so a gateway that answered a lost response already returns the
first result instead of doing the work again. It is sent only when the protos this package carries
have the field, so the package works with gateways from before and after it.

Identity: `api_key=` is sent as `x-api-key` on every call (the gateway's tenants: each key belongs to
one). TLS: `tls=True` (the system's roots) or `tls_ca_file=` (a PEM bundle, e.g. for a self-signed
certificate); `tls_server_name=` checks the certificate against that name instead of the address's
host. Unset arguments fall back to LIPLINE_API_KEY, LIPLINE_TLS, LIPLINE_TLS_CA_FILE and
LIPLINE_TLS_SERVER_NAME.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from lipline_client.retry import RESUME_POLICY, RetryPolicy, retry_delay_s
from lipline_client.streams import stream_responses, unary_response
from lipline_client.v1 import gateway_pb2, gateway_pb2_grpc, session_pb2

_LOGGER = logging.getLogger(__name__)
T = TypeVar("T")

API_KEY_HEADER = "x-api-key"
UPLOAD_CHUNK = 1 << 20  # bytes per CreateAvatar message
MAX_RECONNECT_BACKOFF_MS = 4000  # reconnect within seconds of a gateway coming back (gRPC's grows to 120 s)
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # the gateway's default limit
TERMINAL = frozenset({gateway_pb2.JOB_STATE_SUCCEEDED, gateway_pb2.JOB_STATE_FAILED, gateway_pb2.JOB_STATE_CANCELLED})
#: WatchJob ran into a wall that `wait` resumes after (a gateway restart or drain, a connection reaching the
#: gateway's max_connection_age, a network blip): any other status is the answer
RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
_TRUE = {"1", "true", "yes", "on"}


@dataclasses.dataclass(frozen=True)
class OutputUrl:
    """Where a finished job's MP4 can be fetched with a plain HTTP GET, until `expires_at` (UTC)."""

    url: str
    expires_at: datetime.datetime


@dataclasses.dataclass(frozen=True)
class Connection:
    """How a client reaches the gateway, from its arguments or the LIPLINE_* variables: the channel's
    options, its TLS credentials (None: plaintext) and the metadata every call carries (the API key).
    The synchronous LiplineClient and the asyncio live sessions (lipline_client.live) share it."""

    options: tuple[tuple[str, int | str], ...]
    credentials: grpc.ChannelCredentials | None
    metadata: tuple[tuple[str, str], ...]

    @classmethod
    def resolve(
        cls,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        *,
        api_key: str | None = None,
        tls: bool | None = None,
        tls_ca_file: str | None = None,
        tls_server_name: str | None = None,
    ) -> Connection:
        env = os.environ
        api_key = env.get("LIPLINE_API_KEY", "").strip() if api_key is None else api_key
        tls_ca_file = env.get("LIPLINE_TLS_CA_FILE", "") if tls_ca_file is None else tls_ca_file
        tls_server_name = env.get("LIPLINE_TLS_SERVER_NAME", "") if tls_server_name is None else tls_server_name
        if tls is None:
            tls = env.get("LIPLINE_TLS", "").lower() in _TRUE
        options: list[tuple[str, int | str]] = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
        ]
        credentials = None
        if tls or tls_ca_file:
            roots = Path(tls_ca_file).read_bytes() if tls_ca_file else None
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            credentials = grpc.ssl_channel_credentials(root_certificates=roots)
        metadata = ((API_KEY_HEADER, api_key),) if api_key else ()
        return cls(tuple(options), credentials, metadata)


def has_field(message: type[Message], name: str) -> bool:
    """Whether the protos this package carries have `message.name` (a field a newer gateway added)."""
    return name in message.DESCRIPTOR.fields_by_name


class LiplineClient:
    """A connection to one gateway address (several replicas behind one name balance per connection)."""

    def __init__(
        self,
        address: str,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        timeout: float = 600.0,
        api_key: str | None = None,
        *,
        tls: bool | None = None,
        tls_ca_file: str | None = None,
        tls_server_name: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """`timeout` bounds every call (and all of `wait`) unless a method is given its own; `retry`
        says how calls are retried (RetryPolicy(); `NO_RETRY` turns it off). See the module's doc."""
        connection = Connection.resolve(
            max_message_bytes, api_key=api_key, tls=tls, tls_ca_file=tls_ca_file, tls_server_name=tls_server_name
        )
        if connection.credentials is not None:
            channel = grpc.secure_channel(address, connection.credentials, options=connection.options)
        else:
            channel = grpc.insecure_channel(address, options=connection.options)
        if connection.metadata:
            channel = grpc.intercept_channel(channel, _Metadata(connection.metadata))
        self.channel: grpc.Channel = channel
        #: the raw stub, for what the typed methods do not cover (the API key travels with it too)
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        # `wait` follows a job for minutes: a rolling restart of the gateways (a new pod takes seconds
        # to serve) must not end it, so by default it resumes for longer than one call retries.
        self.resume = retry or RESUME_POLICY

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> LiplineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- avatars ----------------------------------------------------------------------------------

    def create_avatar(
        self,
        data: bytes,
        name: str = "",
        photo_fps: float = 0.0,
        *,
        request_id: str | None = None,
        model: str = "",
        timeout: float | None = None,
    ) -> gateway_pb2.Avatar:
        """Register a photo or short video (sent in 1 MiB messages). The same tenant's same bytes give
        the same avatar, so a retry never makes a second one. `model`: its generator tier ("wav2lip"
        when empty, or "musetalk" where the deployment serves it)."""
        extra: dict[str, str] = self._request_id(gateway_pb2.CreateAvatarRequest, request_id)
        if model:
            extra["model"] = model

        def requests() -> Iterator[gateway_pb2.CreateAvatarRequest]:
            yield gateway_pb2.CreateAvatarRequest(name=name, photo_fps=photo_fps, data=data[:UPLOAD_CHUNK], **extra)
            for start in range(UPLOAD_CHUNK, len(data), UPLOAD_CHUNK):
                yield gateway_pb2.CreateAvatarRequest(data=data[start : start + UPLOAD_CHUNK])

        return self._call(
            "CreateAvatar", lambda t: unary_response(self.stub.CreateAvatar, requests(), timeout=t), timeout, True
        )

    def get_avatar(self, avatar_id: str, *, timeout: float | None = None) -> gateway_pb2.Avatar:
        request = gateway_pb2.GetAvatarRequest(avatar_id=avatar_id)
        return self._call("GetAvatar", lambda t: self.stub.GetAvatar(request, timeout=t), timeout, True)

    def list_avatars(self, *, model: str = "", timeout: float | None = None) -> list[gateway_pb2.Avatar]:
        """The caller's avatars (of generator tier `model` when given), every page of them (`timeout` per page)."""
        request = gateway_pb2.ListAvatarsRequest(model=model) if model else gateway_pb2.ListAvatarsRequest()
        return list(self._pages("ListAvatars", request, "avatars", timeout))

    def delete_avatar(self, avatar_id: str, *, timeout: float | None = None) -> None:
        request = gateway_pb2.DeleteAvatarRequest(avatar_id=avatar_id)
        self._call("DeleteAvatar", lambda t: self.stub.DeleteAvatar(request, timeout=t), timeout, True)

    # -- jobs -------------------------------------------------------------------------------------

    def submit_job(
        self,
        avatar_id: str,
        audio: bytes = b"",
        *,
        audio_uri: str = "",
        super_resolution: bool = False,
        crf: int = 0,
        loop: int = gateway_pb2.JobOptions.PING_PONG,
        request_id: str | None = None,
        labels: dict[str, str] | None = None,
        callback_url: str = "",
        timeout: float | None = None,
    ) -> gateway_pb2.Job:
        """Queue a job: the audio file's bytes, or `audio_uri` (`s3://` in the gateway's bucket, or
        `https://` on a host its operator allows) for the gateway to fetch. Returns at once (QUEUED).
        With `callback_url` (a host its operator allows) the gateway POSTs the ended job there, signed
        with the tenant's webhook secret (see the README's webhook section for checking it)."""
        options = gateway_pb2.JobOptions(super_resolution=super_resolution, crf=crf, loop=loop)
        if callback_url:
            options.callback_url = callback_url
        extra = self._request_id(gateway_pb2.SubmitJobRequest, request_id)
        request = gateway_pb2.SubmitJobRequest(
            avatar_id=avatar_id, audio=audio, audio_uri=audio_uri, options=options, labels=labels or {}, **extra
        )
        return self._call("SubmitJob", lambda t: self.stub.SubmitJob(request, timeout=t), timeout, bool(extra))

    def list_jobs(
        self,
        *,
        states: Iterable[int] = (),
        label_selector: str = "",
        page_size: int = 0,
        timeout: float | None = None,
    ) -> Iterator[gateway_pb2.Job]:
        """The caller's jobs, newest first, every page of them (filters as ListJobs has them)."""
        request = gateway_pb2.ListJobsRequest(states=list(states), label_selector=label_selector, page_size=page_size)
        return self._pages("ListJobs", request, "jobs", timeout)

    def delete_job(self, job_id: str, *, timeout: float | None = None) -> None:
        """Removes a finished job and its files (FAILED_PRECONDITION while it runs: cancel it first)."""
        request = gateway_pb2.DeleteJobRequest(job_id=job_id)
        self._call("DeleteJob", lambda t: self.stub.DeleteJob(request, timeout=t), timeout, True)

    def get_job(self, job_id: str, *, timeout: float | None = None) -> gateway_pb2.Job:
        request = gateway_pb2.GetJobRequest(job_id=job_id)
        return self._call("GetJob", lambda t: self.stub.GetJob(request, timeout=t), timeout, True)

    def cancel_job(self, job_id: str, *, timeout: float | None = None) -> gateway_pb2.Job:
        """CANCELLED unless it had finished (then returned unchanged): safe to repeat."""
        request = gateway_pb2.CancelJobRequest(job_id=job_id)
        return self._call("CancelJob", lambda t: self.stub.CancelJob(request, timeout=t), timeout, True)

    def wait(
        self,
        job_id: str,
        on_event: Callable[[gateway_pb2.Job], None] | None = None,
        *,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> gateway_pb2.Job:
        """Follow WatchJob until the job has finished; returns its final state. `on_event` sees every
        state on the way (progress, stage, ETA); it may see one twice.

        A stream that is cut (RESUMABLE) is resumed: after a back-off GetJob reads the job (it may
        have finished meanwhile) and WatchJob is opened again. `retry.max_attempts` failures in a row
        (by default `RESUME_POLICY`: ~30 s of outage, or the client's own policy when it was given one)
        (no event in between) raise the last error, as does any other status.
        """
        policy = retry or self.resume
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        request = gateway_pb2.WatchJobRequest(job_id=job_id)
        job: gateway_pb2.Job | None = None
        failures = 0

        def seen(new: gateway_pb2.Job) -> gateway_pb2.Job:
            if on_event is not None:
                on_event(new)
            return new

        while True:
            try:
                if failures:
                    job = seen(self.stub.GetJob(gateway_pb2.GetJobRequest(job_id=job_id), timeout=_left(deadline)))
                    if job.state in TERMINAL:
                        return job
                for event in self.stub.WatchJob(request, timeout=_left(deadline)):
                    job, failures = seen(event.job), 0
                if job is not None and job.state in TERMINAL:
                    return job
                error: grpc.RpcError = _StreamEnded(job_id)  # ended early without an error: resume too
            except grpc.RpcError as exc:
                if exc.code() not in RESUMABLE:
                    raise
                error = exc
            failures += 1
            delay = retry_delay_s(error, failures, policy, idempotent=True)
            if delay is None or time.monotonic() + delay >= deadline:
                raise error
            _LOGGER.info("WatchJob of %s was cut (%s); resuming in %.2f s", job_id, error.code().name, delay)
            time.sleep(delay)

    def download(self, job_id: str, path: Path | str, *, timeout: float | None = None) -> int:
        """Write the finished job's MP4 to `path` (through `path.part`, renamed once complete: a
        failed download leaves no partial file under `path`); returns its size in bytes. A download
        cut by UNAVAILABLE starts again from the beginning."""
        path = Path(path)
        tmp = path.with_name(path.name + ".part")
        request = gateway_pb2.DownloadOutputRequest(job_id=job_id)

        def fetch(t: float) -> int:
            size = 0
            with tmp.open("wb") as f:
                for chunk in self.stub.DownloadOutput(request, timeout=t):
                    f.write(chunk.data)
                    size += len(chunk.data)
            return size

        try:
            size = self._call("DownloadOutput", fetch, timeout, True)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(path)
        return size

    def get_output_url(self, job_id: str, *, timeout: float | None = None) -> OutputUrl:
        """A presigned URL of the finished job's MP4 (blob stores on S3; FAILED_PRECONDITION otherwise)."""
        request = gateway_pb2.GetOutputUrlRequest(job_id=job_id)
        response = self._call("GetOutputUrl", lambda t: self.stub.GetOutputUrl(request, timeout=t), timeout, True)
        return OutputUrl(response.url, response.expire_time.ToDatetime(tzinfo=datetime.UTC))

    # -- live sessions ----------------------------------------------------------------------------

    def create_session(
        self,
        avatar_id: str,
        *,
        sample_rate: int = 16000,
        codec: int = session_pb2.VIDEO_CODEC_H264,
        max_height: int = 0,
        fps: float = 0.0,
        crf: int = 0,
        jpeg_quality: int = 0,
        super_resolution: bool = False,
        max_session_seconds: float = 0.0,
        idle_timeout_seconds: float = 0.0,
        timeout: float | None = None,
    ) -> session_pb2.Session:
        """A new session, with its resume token (Converse needs it). 0 leaves a field to the gateway.
        When no live worker has room (RESOURCE_EXHAUSTED + retry-after-ms) it is retried as the
        gateway suggests, within the deadline."""
        request = session_pb2.CreateSessionRequest(
            avatar_id=avatar_id,
            audio=session_pb2.AudioFormat(sample_rate=sample_rate),
            video=session_pb2.VideoFormat(
                codec=codec,  # type: ignore[arg-type]  # an int of the enum
                max_height=max_height,
                fps=fps,
                crf=crf,
                jpeg_quality=jpeg_quality,
            ),
            super_resolution=super_resolution,
            limits=session_pb2.SessionLimits(
                max_session_seconds=max_session_seconds, idle_timeout_seconds=idle_timeout_seconds
            ),
        )
        # Not repeated after UNAVAILABLE: a second session would hold a worker's slot until its idle timeout.
        return self._call("CreateSession", lambda t: self.stub.CreateSession(request, timeout=t), timeout, False)

    def converse(self, requests: Iterable[session_pb2.ConverseRequest], timeout: float | None = None) -> Any:
        """The session's bidi stream: `requests` starts with a ConverseStart (`converse_start`), then
        audio chunks, EndOfUtterance and Clear. Returns gRPC's response iterator of ConverseResponse
        (iterate it for frames, events and stats; `cancel()` ends the stream). No deadline unless
        given: a session lives as long as its limits. A cut stream is resumed by calling this again
        with a ConverseStart naming the last frame received. An exception `requests` raise ends the
        stream, and iterating the responses raises it (not the RpcError it caused)."""
        return stream_responses(self.stub.Converse, requests, timeout=timeout)

    def get_session(self, session_id: str, *, timeout: float | None = None) -> session_pb2.Session:
        request = session_pb2.GetSessionRequest(session_id=session_id)
        return self._call("GetSession", lambda t: self.stub.GetSession(request, timeout=t), timeout, True)

    def close_session(self, session_id: str, *, timeout: float | None = None) -> session_pb2.Session:
        """CLOSED, its worker's slot freed; an ended session is returned unchanged (safe to repeat)."""
        request = session_pb2.CloseSessionRequest(session_id=session_id)
        return self._call("CloseSession", lambda t: self.stub.CloseSession(request, timeout=t), timeout, True)

    # -- helpers ----------------------------------------------------------------------------------

    def _request_id(self, message: type[Message], given: str | None) -> dict[str, str]:
        """`{"request_id": ...}` for a create whose request has the field (a new UUID unless given), else {}."""
        if not has_field(message, "request_id"):
            if given:
                raise ValueError(f"{message.DESCRIPTOR.name} has no request_id in this lipline-client's protos")
            return {}
        return {"request_id": given or str(uuid.uuid4())}

    def _pages(self, method: str, request: Message, items: str, timeout: float | None) -> Iterator[Any]:
        """The items of a list RPC, page after page (AIP-158: `page_token` in, `next_page_token` out)
        where its protos have paging, else its one answer. Each page is a call of its own, retried
        alone (a list is a read). Rows the gateway could not read (`unreadable_*_ids`) are logged:
        a get of one answers DATA_LOSS naming what is damaged."""
        rpc = getattr(self.stub, method)
        paged = has_field(type(request), "page_token")
        unreadable = f"unreadable_{items[:-1]}_ids"  # "jobs" -> unreadable_job_ids
        while True:
            response = self._call(method, lambda t: rpc(request, timeout=t), timeout, True)
            yield from getattr(response, items)
            if has_field(type(response), unreadable) and getattr(response, unreadable):
                _LOGGER.warning(
                    "%s: the gateway could not read %s (left out; a get of one says what is damaged)",
                    method,
                    ", ".join(getattr(response, unreadable)),
                )
            token = getattr(response, "next_page_token", "") if paged else ""
            if not token:
                return
            following = type(request)()
            following.CopyFrom(request)  # the same filters, the next page
            setattr(following, "page_token", token)
            request = following

    def _call(self, method: str, attempt: Callable[[float], T], timeout: float | None, idempotent: bool) -> T:
        """`attempt(seconds left)` until it succeeds, a status is not retried, or the deadline is near."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        failures = 0
        while True:
            try:
                return attempt(_left(deadline))
            except grpc.RpcError as error:
                failures += 1
                delay = retry_delay_s(error, failures, self.retry, idempotent)
                if delay is None or time.monotonic() + delay >= deadline:
                    raise
                _LOGGER.info(
                    "%s failed (%s: %s); retrying in %.2f s (attempt %d/%d)",
                    method,
                    error.code().name,
                    error.details(),
                    delay,
                    failures + 1,
                    self.retry.max_attempts,
                )
                time.sleep(delay)


def converse_start(
    session: session_pb2.Session, last_frame: int = -1, ack_window: int = 0
) -> session_pb2.ConverseRequest:
    """The first message of a Converse stream (`last_frame`: the last frame received, on a resume;
    `ack_window`: frames the gateway may send past the last FrameAck, 0 for no acknowledgements)."""
    return session_pb2.ConverseRequest(
        start=session_pb2.ConverseStart(
            session_id=session.id, resume_token=session.resume_token, last_frame=last_frame, ack_window=ack_window
        )
    )


def frame_ack(frame: session_pb2.VideoFrame) -> session_pb2.ConverseRequest:
    """The acknowledgement of `frame` (and every frame before it) on a stream with an ack_window."""
    return session_pb2.ConverseRequest(ack=session_pb2.FrameAck(frame=frame.index))


def _left(deadline: float) -> float:
    """Seconds to `deadline`, at least a little (an expired deadline then fails as DEADLINE_EXCEEDED)."""
    return max(deadline - time.monotonic(), 0.001)


class _StreamEnded(grpc.RpcError):
    """WatchJob ended without an error before the job finished (resumable, like a cut stream)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"WatchJob of {job_id} ended before the job finished")
        self._details = str(self)

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


class _Metadata(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds fixed metadata (the API key) to every call, the raw stub's included."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _CallDetails(
            details.method,
            details.timeout,
            (*(details.metadata or ()), *self._metadata),
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression) -> None:
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression
