"""A small synchronous client of the public API, for product backends, the demo and tests.

The gateway identifies a client by its `x-api-key` metadata (`api_key=`), else by its IP address:
per-client limits (concurrent calls, queued jobs) count per identity, so clients that share a host
(or a NAT) share the limits unless they send different keys. Where the gateway checks API keys
(the chart's default), a call without a valid key ends UNAUTHENTICATED and the identity is the key's name.

TLS: `tls=True` (the system's roots) or `tls_ca_file=` (a PEM bundle, e.g. a self-signed certificate)
connect with `grpc.ssl_channel_credentials`; `tls_server_name=` checks the certificate against that
name instead of the address's host. Unset arguments fall back to LIPLINE_API_KEY, LIPLINE_TLS,
LIPLINE_TLS_CA_FILE and LIPLINE_TLS_SERVER_NAME (how the chart's `helm test` pod passes them).

Live sessions: `create_session`, `converse` (the bidi stream), `get_session`, `close_session`;
services.gateway.live_client sends speech in real time and records what comes back, and is this
module's command line: `python -m services.gateway.client live --avatar ID speech.wav out.mp4`.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import grpc

from lipline.v1 import gateway_pb2, gateway_pb2_grpc, session_pb2
from services.serving.auth import API_KEY_HEADER
from services.serving.channels import channel_options

_LOGGER = logging.getLogger(__name__)
UPLOAD_CHUNK = 1 << 20
TERMINAL = frozenset({gateway_pb2.JOB_STATE_SUCCEEDED, gateway_pb2.JOB_STATE_FAILED, gateway_pb2.JOB_STATE_CANCELLED})
#: what `wait` resumes after: the stream was cut (a gateway restart or drain, a connection reaching the
#: gateway's max_connection_age, a network blip), not refused; any other status is the answer
RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
MAX_RECONNECT_BACKOFF_MS = 4000


class LiplineClient:
    def __init__(
        self,
        address: str,
        max_message_bytes: int = 64 * 1024 * 1024,
        timeout: float = 600.0,
        api_key: str | None = None,
        *,
        tls: bool | None = None,
        tls_ca_file: str | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        """`timeout` bounds every call (and all of `wait`); `api_key` is sent as `x-api-key` metadata;
        `tls`/`tls_ca_file`/`tls_server_name` as in the module's doc (None: from the environment)."""
        env = os.environ
        api_key = env.get("LIPLINE_API_KEY", "").strip() if api_key is None else api_key
        tls_ca_file = env.get("LIPLINE_TLS_CA_FILE", "") if tls_ca_file is None else tls_ca_file
        tls_server_name = env.get("LIPLINE_TLS_SERVER_NAME", "") if tls_server_name is None else tls_server_name
        if tls is None:
            tls = env.get("LIPLINE_TLS", "").lower() in {"1", "true", "yes", "on"}
        # Reconnect within a few seconds of a gateway coming back (gRPC's backoff grows to 120 s).
        options: list[tuple[str, int | str]] = [
            *channel_options(max_message_bytes),
            ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
        ]
        if tls or tls_ca_file:
            roots = Path(tls_ca_file).read_bytes() if tls_ca_file else None
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self.channel = grpc.secure_channel(
                address, grpc.ssl_channel_credentials(root_certificates=roots), options=options
            )
        else:
            self.channel = grpc.insecure_channel(address, options=options)
        if api_key:
            self.channel = grpc.intercept_channel(self.channel, _Metadata(((API_KEY_HEADER, api_key),)))
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> LiplineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_avatar(self, data: bytes, name: str = "", photo_fps: float = 0.0) -> gateway_pb2.Avatar:
        def requests() -> Iterator[gateway_pb2.CreateAvatarRequest]:
            yield gateway_pb2.CreateAvatarRequest(name=name, photo_fps=photo_fps, data=data[:UPLOAD_CHUNK])
            for start in range(UPLOAD_CHUNK, len(data), UPLOAD_CHUNK):
                yield gateway_pb2.CreateAvatarRequest(data=data[start : start + UPLOAD_CHUNK])

        return self.stub.CreateAvatar(requests(), timeout=self.timeout)

    def submit(self, avatar_id: str, audio: bytes, super_resolution: bool = False, crf: int = 0) -> gateway_pb2.Job:
        options = gateway_pb2.JobOptions(super_resolution=super_resolution, crf=crf)
        return self.stub.SubmitJob(
            gateway_pb2.SubmitJobRequest(avatar_id=avatar_id, audio=audio, options=options), timeout=self.timeout
        )

    def wait(
        self,
        job_id: str,
        on_event: Callable[[gateway_pb2.Job], None] | None = None,
        *,
        retries: int = 8,
        backoff_s: float = 0.25,
        max_backoff_s: float = 5.0,
    ) -> gateway_pb2.Job:
        """Follow WatchJob until the job is finished; returns its final state.

        A stream that is cut (a status in RESUMABLE) is resumed: after a back-off (doubling from
        `backoff_s` up to `max_backoff_s`, with jitter) GetJob reads the job (it may have finished
        meanwhile; `on_event` sees it too) and WatchJob is opened again. `retries` failures in a
        row (no event in between) raise the last error, as does any other status; all of `wait`
        takes at most `timeout` seconds (then DEADLINE_EXCEEDED). `on_event` may see a state twice.
        """
        deadline = time.monotonic() + self.timeout
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
            delay = min(max_backoff_s, backoff_s * 2 ** (failures - 1)) * random.uniform(0.5, 1.0)
            if failures > retries or time.monotonic() + delay >= deadline:
                raise error
            _LOGGER.info(
                "WatchJob of %s was cut (%s); resuming in %.2f s (%d/%d)",
                job_id,
                error.code().name,
                delay,
                failures,
                retries,
            )
            time.sleep(delay)

    def avatar_ids(self) -> set[str]:
        """Every avatar id of the caller (ListAvatars, page by page)."""
        ids: set[str] = set()
        request = gateway_pb2.ListAvatarsRequest(page_size=1000)
        while True:
            page = self.stub.ListAvatars(request, timeout=self.timeout)
            ids.update(a.id for a in page.avatars)
            if not page.next_page_token:
                return ids
            request.page_token = page.next_page_token

    def delete_avatar(self, avatar_id: str) -> None:
        self.stub.DeleteAvatar(gateway_pb2.DeleteAvatarRequest(avatar_id=avatar_id), timeout=self.timeout)

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
    ) -> session_pb2.Session:
        """A new session (with its resume token: Converse needs it). 0 leaves a field to the gateway."""
        request = session_pb2.CreateSessionRequest(
            avatar_id=avatar_id,
            audio=session_pb2.AudioFormat(sample_rate=sample_rate),
            video=session_pb2.VideoFormat(
                codec=cast("session_pb2.VideoCodec", codec),
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
        return self.stub.CreateSession(request, timeout=self.timeout)

    def converse(self, requests: Iterator[session_pb2.ConverseRequest], timeout: float | None = None) -> Any:
        """The session's stream: `requests` starts with ConverseStart; returns gRPC's response iterator
        (iterate it for frames, events and stats; `cancel()` ends the stream). No deadline unless given:
        a session lives as long as its limits."""
        return self.stub.Converse(requests, timeout=timeout)

    def get_session(self, session_id: str) -> session_pb2.Session:
        return self.stub.GetSession(session_pb2.GetSessionRequest(session_id=session_id), timeout=self.timeout)

    def close_session(self, session_id: str) -> session_pb2.Session:
        return self.stub.CloseSession(session_pb2.CloseSessionRequest(session_id=session_id), timeout=self.timeout)

    def download(self, job_id: str, path: Path) -> int:
        tmp = path.with_name(path.name + ".part")
        size = 0
        with tmp.open("wb") as f:
            for chunk in self.stub.DownloadOutput(
                gateway_pb2.DownloadOutputRequest(job_id=job_id), timeout=self.timeout
            ):
                f.write(chunk.data)
                size += len(chunk.data)
        tmp.replace(path)
        return size


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
    """Adds fixed metadata (the API key) to every call."""

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


def render_file(
    client: LiplineClient,
    avatar: Path,
    audio: Path,
    output: Path,
    *,
    super_resolution: bool = True,
    write: Callable[[str], None] = print,
) -> tuple[gateway_pb2.Avatar, gateway_pb2.Job]:
    """Register `avatar`, render `audio` onto it and download the MP4 to `output` (when the job succeeds).

    The round trip the demo and the deployment's smoke test both make; progress goes to `write`.
    Returns the avatar and the job's final state; the caller decides what a failure means.
    """
    registered = client.create_avatar(avatar.read_bytes(), name=avatar.name)
    write(
        f"avatar {registered.id}: {registered.width}x{registered.height}, {registered.frame_count} frame(s), face found in {registered.faces_found}"
    )
    job = client.submit(registered.id, audio.read_bytes(), super_resolution=super_resolution)
    write(f"job {job.id}: {job.audio_seconds:.2f} s of audio")
    job = client.wait(job.id, progress_printer(write))
    if job.state == gateway_pb2.JOB_STATE_SUCCEEDED:
        client.download(job.id, output)
    return registered, job


def progress_printer(write: Callable[[str], None], step: float = 0.1) -> Callable[[gateway_pb2.Job], None]:
    """A `wait(on_event=...)` callback that writes one line per `step` of progress and per state change."""
    last: dict[str, Any] = {"progress": -1.0, "state": None}

    def show(job: gateway_pb2.Job) -> None:
        if job.progress - last["progress"] >= step or job.state != last["state"]:
            last["progress"], last["state"] = job.progress, job.state
            write(
                f"  {gateway_pb2.JobState.Name(job.state):20s} {job.stage:8s} {job.frames_done}/{job.total_frames} "
                f"frames  {job.elapsed_seconds:6.1f} s elapsed  eta {job.eta_seconds:.1f} s"
            )

    return show


def main(argv: list[str] | None = None) -> int:
    """`python -m services.gateway.client live ...` (services.gateway.live_client has the commands)."""
    from services.gateway.live_client import live_command, parse_args

    args = parse_args(argv)
    with LiplineClient(args.address, api_key=args.api_key) as client:
        return live_command(client, args)


if __name__ == "__main__":
    sys.exit(main())
