"""Settings of the gateway (`python -m services.gateway`)."""

from __future__ import annotations

import dataclasses
import os

from services.serving.settings import ADDRESS_FORMS, StoreSettings, address_field, output_ttl_field, setting
from services.serving.stages import STAGES


@dataclasses.dataclass(frozen=True)
class GatewaySettings(StoreSettings):
    """Settings of the gateway: the public API. It keeps no state of its own (jobs and blobs live in the stores)."""

    port: int = setting(STAGES["gateway"].port, "gRPC port of the public API")
    metrics_port: int = setting(
        STAGES["gateway"].metrics_port, "Prometheus /metrics HTTP port (0 = any free port, -1 = off)"
    )
    audio_address: str = address_field(STAGES["audio"].local_address, "audio")
    lipsync_address: str = address_field(STAGES["lipsync"].local_address, "lipsync (DetectFaces for CreateAvatar)")
    lipsync_musetalk_address: str = setting(
        "",
        "lipsync-musetalk stage (PrepareAvatar for CreateAvatar of model musetalk): "
        f"{ADDRESS_FORMS}; empty = this deployment does not serve the musetalk tier (CreateAvatar answers FAILED_PRECONDITION)",
    )
    max_audio_bytes: int = setting(50 * 1024 * 1024, "largest audio file of a job")
    max_audio_seconds: float = setting(600.0, "longest audio of a job")
    max_avatar_bytes: int = setting(200 * 1024 * 1024, "largest avatar upload")
    max_avatar_frames: int = setting(1500, "most frames of an avatar video (60 s at 25 fps)")
    max_avatar_pixels: int = setting(1920 * 1080, "largest avatar frame size in pixels")
    max_active_jobs: int = setting(
        256, "queued + running jobs in the whole store; more are rejected RESOURCE_EXHAUSTED"
    )
    queue_retry_after_ms: int = setting(
        5000,
        "the retry-after-ms hint of a SubmitJob refused because max_active_jobs or max_active_jobs_per_client is reached "
        "(a client backs off that long and tries again)",
    )
    max_active_jobs_per_client: int = setting(
        32,
        "queued + running jobs of one client (the job's owner: its API key's tenant when API keys are on, else its x-api-key "
        "metadata or its IP address); more are rejected RESOURCE_EXHAUSTED; 0 = no cap",
    )
    max_streams_per_client: int = setting(
        64,
        "max concurrent RPCs of one client (its API key's tenant when API keys are on, else its x-api-key metadata or its IP address; an idle WatchJob "
        "counts until it ends); more are rejected RESOURCE_EXHAUSTED; health checks are never refused; 0 = no cap",
    )
    avatar_purge_interval_s: float = setting(
        30.0,
        "how often the gateway purges the data of deleted avatars whose jobs have all finished (DeleteAvatar purges at once when no job uses it)",
    )
    max_connection_age_grace_s: float = setting(
        86400.0,
        "after max_connection_age_s, how long the public API's open streams (WatchJob, DownloadOutput) may go on "
        "before they are cut UNAVAILABLE: a day, so clients without resume logic (grpcurl, Node) see a stream end "
        "only when the job ends; new calls move to a new connection at once, which is what rebalances",
    )
    max_session_seconds: float = setting(
        3600.0,
        "the longest a live session may live, and its limit when CreateSession asks for none; asking for more is INVALID_ARGUMENT "
        "(the live workers' max_session_seconds must be at least this)",
    )
    session_idle_timeout_s: float = setting(
        60.0,
        "how long a live session may wait with no Converse stream before it ends: its idle timeout when CreateSession asks for none, "
        "and the longest it may ask for (more is INVALID_ARGUMENT); the live workers' idle_timeout_s must be at least this",
    )
    max_sessions_per_tenant: int = setting(
        0,
        "live sessions one tenant may hold open at once; more are rejected RESOURCE_EXHAUSTED; 0 = no cap (the live workers' capacity still holds)",
    )
    live_worker_fresh_s: float = setting(
        5.0,
        "a live worker whose last heartbeat in the job store is older than this is not given sessions (it died or lost the store)",
    )
    live_open_timeout_s: float = setting(
        30.0,
        "how long a live worker's OpenSession may take (it loads the avatar, which may be its first use on that worker)",
    )
    session_retry_after_ms: int = setting(
        2000,
        "the retry-after-ms hint of a CreateSession refused because no live worker has room (when the workers gave none)",
    )
    audio_uri_hosts: str = setting(
        "",
        "hosts SubmitJob's audio_uri may fetch https:// audio from, comma-separated: `host` (port 443) or `host:port`; "
        "empty = https audio URIs are refused (s3:// URIs in the blob store's bucket work whenever it is on S3)",
    )
    audio_uri_ca_file: str = setting(
        "", "PEM bundle of the CAs an audio_uri host's certificate may chain to (empty = the system's roots)"
    )
    audio_uri_timeout_s: float = setting(
        30.0, "the longest fetching an audio_uri may take, redirects included; slower is DEADLINE_EXCEEDED"
    )
    output_url_ttl_s: float = setting(
        3600.0,
        "how long a GetOutputUrl URL works (S3 presigned URLs: at most 7 days; never past the output's expiry)",
    )
    output_ttl_s: float = output_ttl_field()
    callback_hosts: str = setting(
        "",
        "hosts a job's callback_url may name over https://, comma-separated: `host` (port 443) or `host:port`; "
        "empty = https callback URLs are refused (the same rules as audio_uri_hosts)",
    )
    callback_http_hosts: str = setting(
        "",
        "hosts a job's callback_url may name over plain http://, comma-separated: `host` (port 80) or `host:port`; "
        "only for receivers inside a trusted network (the body is signed, not encrypted); empty = none",
    )
    callback_ca_file: str = setting(
        "",
        "PEM bundle of the CAs that sign callback receivers' certificates (an internal CA); empty = the system's roots",
    )
    webhook_secrets_file: str = setting(
        "",
        "file of per-tenant webhook signing secrets, one `tenant:secret` per line (services/serving/tenants.py); "
        "a tenant without one cannot set callback_url",
    )
    callback_timeout_s: float = setting(
        10.0, "the longest one webhook POST may take (connect to response); slower counts as a failed attempt"
    )
    callback_retry_window_s: float = setting(
        86400.0,
        "how long after a job ends its webhook is retried (exponential back-off) before it is given up (GAVE_UP in GetJob)",
    )
    callback_backoff_s: float = setting(
        2.0,
        "the wait after a webhook's first failed attempt; it doubles after each failure, up to callback_backoff_max_s",
    )
    callback_backoff_max_s: float = setting(600.0, "the longest wait between two attempts of a webhook")
    callback_poll_s: float = setting(1.0, "how often an idle gateway looks for webhooks due in the job store")
    callback_concurrency: int = setting(
        16, "webhook POSTs one gateway has in flight at once (a hanging receiver holds one for callback_timeout_s)"
    )
    request_id_window_s: float = setting(
        86400.0,
        "how long a SubmitJob or CreateAvatar request_id is remembered: a repeat within this returns what the first made, "
        "one after it makes a new job or avatar",
    )
    segment_seconds: float = setting(2.0, "length of a render segment (the unit of work a render worker claims)")
    stage_wait_s: float = setting(60.0, "at start-up, how long to wait for the stages to be SERVING")

    def validate(self) -> None:
        super().validate()
        problems = []
        if not 0.2 <= self.segment_seconds <= 60:
            problems.append(f"segment_seconds must be in 0.2..60, got {self.segment_seconds}")
        for name in ("audio_uri_ca_file", "callback_ca_file"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                problems.append(f"{name} {path} is not a readable file (a PEM bundle of CA certificates)")
        if not 0.1 <= self.avatar_purge_interval_s <= 3600:
            problems.append(f"avatar_purge_interval_s must be in 0.1..3600, got {self.avatar_purge_interval_s}")
        if not 1 <= self.request_id_window_s <= 30 * 86400:
            problems.append(f"request_id_window_s must be in 1..2592000 (30 days), got {self.request_id_window_s}")
        if self.max_active_jobs < 1:
            problems.append(f"max_active_jobs must be >= 1, got {self.max_active_jobs}")
        if self.max_active_jobs_per_client < 0:
            problems.append(
                f"max_active_jobs_per_client must be >= 0 (0 = no cap), got {self.max_active_jobs_per_client}"
            )
        if not 1 <= self.max_session_seconds <= 7 * 86400:
            problems.append(f"max_session_seconds must be in 1..604800 (a week), got {self.max_session_seconds}")
        if not 1 <= self.session_idle_timeout_s <= 86400:
            problems.append(f"session_idle_timeout_s must be in 1..86400, got {self.session_idle_timeout_s}")
        if self.max_sessions_per_tenant < 0:
            problems.append(f"max_sessions_per_tenant must be >= 0 (0 = no cap), got {self.max_sessions_per_tenant}")
        if (
            self.live_worker_fresh_s <= 0
            or self.live_open_timeout_s <= 0
            or min(self.session_retry_after_ms, self.queue_retry_after_ms) < 0
        ):
            problems.append(
                "live_worker_fresh_s and live_open_timeout_s must be > 0, session_retry_after_ms and queue_retry_after_ms >= 0"
            )
        if self.max_streams_per_client < 0:
            problems.append(f"max_streams_per_client must be >= 0 (0 = no cap), got {self.max_streams_per_client}")
        if self.max_concurrent_streams < 0:
            problems.append(f"max_concurrent_streams must be >= 0 (0 = no cap), got {self.max_concurrent_streams}")
        if not 0.1 <= self.audio_uri_timeout_s <= 3600:
            problems.append(f"audio_uri_timeout_s must be in 0.1..3600, got {self.audio_uri_timeout_s}")
        if not 1 <= self.output_url_ttl_s <= 7 * 86400:
            problems.append(f"output_url_ttl_s must be in 1..604800 (S3's 7 days), got {self.output_url_ttl_s}")
        if self.output_ttl_s < 0:
            problems.append(f"output_ttl_s must be >= 0 (0 = keep outputs forever), got {self.output_ttl_s}")
        if not 0.1 <= self.callback_timeout_s <= 300:
            problems.append(f"callback_timeout_s must be in 0.1..300, got {self.callback_timeout_s}")
        if not 1 <= self.callback_retry_window_s <= 30 * 86400:
            problems.append(
                f"callback_retry_window_s must be in 1..2592000 (30 days), got {self.callback_retry_window_s}"
            )
        if not 0 < self.callback_backoff_s <= self.callback_backoff_max_s <= 86400:
            problems.append(
                "callback_backoff_s and callback_backoff_max_s must satisfy 0 < callback_backoff_s <= callback_backoff_max_s <= 86400, "
                f"got {self.callback_backoff_s} and {self.callback_backoff_max_s}"
            )
        if not 0.01 <= self.callback_poll_s <= 60:
            problems.append(f"callback_poll_s must be in 0.01..60, got {self.callback_poll_s}")
        if not 1 <= self.callback_concurrency <= 1024:
            problems.append(f"callback_concurrency must be in 1..1024, got {self.callback_concurrency}")
        if problems:
            raise ValueError("; ".join(problems))
