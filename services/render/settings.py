"""Settings of a render worker (`python -m services.render`)."""

from __future__ import annotations

import dataclasses

from services.media.video_format import X264_PRESETS
from services.serving.settings import FaceWorkerSettings, output_ttl_field, setting
from services.serving.stages import STAGES


@dataclasses.dataclass(frozen=True)
class RenderSettings(FaceWorkerSettings):
    """Settings of a render worker: claims segments from the job store, renders them through the stages."""

    port: int = setting(STAGES["render"].port, "gRPC port (health and reflection only: a worker serves no API)")
    metrics_port: int = setting(
        STAGES["render"].metrics_port, "Prometheus /metrics HTTP port (0 = any free port, -1 = off)"
    )
    cache_dir: str = setting(
        "var/render-cache", "local cache of avatars converted for compositing (per worker; safe to lose)"
    )
    lease_s: float = setting(10.0, "a claimed task's lease; a worker that stops renewing loses it after this long")
    heartbeat_s: float = setting(0.5, "how often a worker renews its lease (and notices a cancel)")
    max_attempts: int = setting(
        3,
        "claims of one task that ended in a crash (the worker died or lost the lease, or an unexpected error) before its job fails; "
        "retryable failures (a stage or store unavailable, a full blob store) are bounded by retry_window_s instead",
    )
    retry_window_s: float = setting(
        60.0, "how long a task may keep failing with retryable errors (retried with back-off) before its job fails"
    )
    retry_backoff_s: float = setting(
        0.5, "first delay before a failed task is claimable again; doubles per failure, with jitter"
    )
    retry_backoff_max_s: float = setting(8.0, "the longest delay between two attempts of a failing task")
    loop_stall_s: float = setting(
        60.0,
        "a claim loop with no iteration (and no lease renewal) for this long is stalled: the worker logs it, "
        "reports NOT_SERVING to health checks (the liveness probe restarts it) and sets lipline_render_loop_healthy to 0",
    )
    poll_s: float = setting(0.2, "how often an idle worker looks for work")
    max_tenant_share: float = setting(
        1.0,
        "the fraction of the busy render workers one client may hold while another client's task waits "
        "(0 < share <= 1; 1.0 = off): its tasks, joins included, then go after the others'. Without it, "
        "claims already take turns across clients, then jobs (a short job waits only for running tasks)",
    )
    x264_preset: str = setting(
        "veryfast",
        "x264 speed preset of the output (ultrafast ... veryslow): faster presets cost file size, not quality at a given crf",
    )
    x264_threads: int = setting(
        0, "x264 threads per segment encoder; 0 = auto (the cores this process may use, at most 4)"
    )
    encode_nice: int = setting(
        5,
        "nice value (0-19) of the x264 threads: encoding is bulk work with slack, so a job's audio task, "
        "its join and the stages' host threads on the same machine get the CPU first",
    )
    stage_wait_s: float = setting(60.0, "at start-up, how long to wait for the stages to be SERVING")
    output_ttl_s: float = output_ttl_field()
    janitor_interval_s: float = setting(
        60.0,
        "how often a render worker tries to be the janitor (one at a time, by a lease in the job store), which deletes "
        "expired outputs and the working files jobs that ended left behind",
    )
    janitor_lease_s: float = setting(
        180.0,
        "the janitor's lease: renewed every janitor_interval_s and during a sweep; a janitor that dies is "
        "replaced by another worker this long after its last renewal",
    )
    unreferenced_after_s: float = setting(
        3600.0,
        "the janitor deletes a job's or avatar's files that no row refers to (a gateway died before recording it) "
        "once nothing under that id has been written for this long: far longer than any upload takes",
    )

    def validate(self) -> None:
        super().validate()
        problems = []
        if self.x264_preset not in X264_PRESETS:
            problems.append(f"x264_preset {self.x264_preset!r} is not one of {', '.join(X264_PRESETS)}")
        if self.lease_s <= 2 * self.heartbeat_s:
            problems.append(f"lease_s ({self.lease_s}) must be more than twice heartbeat_s ({self.heartbeat_s})")
        if not 0 <= self.encode_nice <= 19:
            problems.append(f"encode_nice must be in 0..19, got {self.encode_nice}")
        if self.avatar_cache_bytes < 1:
            problems.append(f"avatar_cache_bytes must be >= 1, got {self.avatar_cache_bytes}")
        if not 0 < self.max_tenant_share <= 1:
            problems.append(f"max_tenant_share must be in (0, 1], got {self.max_tenant_share}")
        if self.retry_window_s < 0 or self.retry_backoff_s <= 0 or self.retry_backoff_max_s < self.retry_backoff_s:
            problems.append(
                f"retry_window_s ({self.retry_window_s}) must be >= 0, and 0 < retry_backoff_s ({self.retry_backoff_s}) "
                f"<= retry_backoff_max_s ({self.retry_backoff_max_s})"
            )
        if self.loop_stall_s <= 0:
            problems.append(f"loop_stall_s must be positive, got {self.loop_stall_s}")
        if self.output_ttl_s < 0:
            problems.append(f"output_ttl_s must be >= 0 (0 = keep outputs forever), got {self.output_ttl_s}")
        if self.janitor_interval_s <= 0 or self.janitor_lease_s <= 2 * self.janitor_interval_s:
            problems.append(
                f"janitor_interval_s ({self.janitor_interval_s}) must be positive and janitor_lease_s "
                f"({self.janitor_lease_s}) more than twice it (the holder renews it every interval)"
            )
        if self.unreferenced_after_s <= 0:
            problems.append(f"unreferenced_after_s must be positive, got {self.unreferenced_after_s}")
        if self.max_attempts < 1:
            problems.append(f"max_attempts must be >= 1, got {self.max_attempts}")
        if problems:
            raise ValueError("; ".join(problems))
