"""Settings of a live worker (`python -m services.live`): its capacity, its limits, where its stages are."""

from __future__ import annotations

import dataclasses

from services.media.video_format import X264_PRESETS
from services.serving.settings import FaceWorkerSettings, setting
from services.serving.stages import STAGES


@dataclasses.dataclass(frozen=True)
class LiveSettings(FaceWorkerSettings):
    """Settings of a live worker: holds live sessions, paces their frames, calls lipsync (and superres)."""

    port: int = setting(STAGES["live"].port, "gRPC port of LiveService (the gateway dials it)")
    metrics_port: int = setting(
        STAGES["live"].metrics_port, "Prometheus /metrics HTTP port (0 = any free port, -1 = off)"
    )
    cache_dir: str = setting(
        "var/live-cache", "local cache of avatars converted for compositing (per worker; safe to lose)"
    )
    # Why 16: a 512x512 session costs ~40 ms of CPU per second of speech at x264 ultrafast (mel,
    # compositor and encoder; bench/bench_live_session.py), so a fully used core holds ~25. One worker
    # is one Python process: its tick loops, mel and gRPC framing share one interpreter, and a frame
    # that misses its slot is skipped, so it keeps a third of that core for jitter. Scale with pods.
    # Under load on the H200 host a session cost 73-85 ms of CPU per second (docs/performance.md,
    # "Live sessions on the H200"): 16 sessions are ~1.3 cores, what the chart requests (2) covers.
    max_sessions: int = setting(
        16,
        "sessions this worker holds at once; OpenSession beyond it is RESOURCE_EXHAUSTED with retry-after-ms "
        "(~40 ms CPU per session-second at 512x512 ultrafast: 16 use ~0.65 of a core)",
    )
    advertise_address: str = setting(
        "",
        "host:port the gateway dials for this worker's sessions (the chart sets the pod IP); empty = 127.0.0.1:<the bound port>",
    )
    x264_preset: str = setting(
        "ultrafast", "x264 preset of H.264 sessions (ultrafast: 0.97 ms a 512x512 frame against veryfast's 2.16 ms)"
    )
    max_session_seconds: float = setting(
        3600.0, "the longest a session may live; a session asking for more is INVALID_ARGUMENT"
    )
    idle_timeout_s: float = setting(60.0, "a session with no Converse stream attached for this long ends (CLOSED)")
    max_queued_audio_s: float = setting(
        10.0, "speech queued and not yet played, per session; audio beyond it is RESOURCE_EXHAUSTED"
    )
    max_chunk_ms: int = setting(100, "the longest audio chunk accepted (10 ms is the shortest)")
    face_lead_s: float = setting(
        0.04,
        "how far ahead of its slot a speech frame is sent to the lipsync stage (its face must be back by the slot, "
        "or within face_grace_s): one frame at 25 fps; the face link's 10 ms flush and the stage's ~10-20 ms fit in it",
    )
    musetalk_face_lead_s: float = setting(
        0.1,
        "face_lead_s for the musetalk tier's sessions: its stage answers a batch in ~35 ms (16 faces) to ~80 ms (32) "
        "on an H100, so the 40 ms of Wav2Lip's lead skipped most speech frames (docs/performance.md)",
    )
    face_grace_s: float = setting(
        0.02,
        "how long past its slot's start a speech frame waits for a face not back yet (then skipped); at most half a frame",
    )
    face_flush_ms: float = setting(
        10.0,
        "how often the face link sends the faces asked for (one message for all of the worker's sessions): "
        "a face waits up to this long before it is sent; shorter costs more messages at the lipsync stage",
    )
    send_queue_frames: int = setting(
        50,
        "frames queued per Converse stream for a client that reads slowly (2 s at 25 fps); beyond it the oldest are dropped (counted)",
    )
    # Why 1 s: a viewer that fell behind (it stopped reading, its link stalled) wants the present;
    # frames older than this are dropped, oldest first, and H.264 restarts at a forced IDR.
    send_lag_s: float = setting(
        1.0,
        "a frame queued for a Converse stream this far behind the newest is dropped, oldest first "
        "(a slow reader gets the live edge, H.264 from a forced IDR; counted)",
    )
    lease_s: float = setting(
        10.0, "a session's lease in the job store; a worker that stops renewing it loses its sessions after this long"
    )
    heartbeat_s: float = setting(1.0, "how often the worker renews its sessions' leases and its row in the job store")
    # Why 3 and not the CPUs: the encoders release the GIL inside x264/libjpeg but take it back per
    # frame, and the event loop (ticks, gRPC, the face link) needs it too; 16 threads per worker on a
    # 16-core host skipped 1-2 % of frames at 100 sessions, 3 skipped none (docs/performance.md).
    encode_threads: int = setting(
        3,
        "threads compositing and encoding frames (more than ~3 per worker process only contend for its GIL); 0 = the CPUs this process may use",
    )
    stage_wait_s: float = setting(60.0, "at start-up, how long to wait for the stages to be SERVING")
    musetalk_right_context_ms: float = setting(
        80.0,
        "the musetalk tier's live audio features: how much audio past a frame's own (132.5 ms after its start) "
        "its whisper window holds; the tier's look-ahead is 132.5 ms plus this (80: 212.5 ms, Wav2Lip's)",
    )

    def face_lead(self, musetalk: bool) -> float:
        """How far ahead of its slot a speech frame of a session is sent: the tier's stage sets it."""
        return self.musetalk_face_lead_s if musetalk else self.face_lead_s

    def validate(self) -> None:
        super().validate()
        problems = []
        if self.x264_preset not in X264_PRESETS:
            problems.append(f"x264_preset {self.x264_preset!r} is not one of {', '.join(X264_PRESETS)}")
        if self.max_sessions < 1:
            problems.append(f"max_sessions must be >= 1, got {self.max_sessions}")
        if not 10 <= self.max_chunk_ms <= 1000:
            problems.append(f"max_chunk_ms must be in 10..1000, got {self.max_chunk_ms}")
        if self.max_session_seconds <= 0 or self.idle_timeout_s <= 0 or self.max_queued_audio_s <= 0:
            problems.append("max_session_seconds, idle_timeout_s and max_queued_audio_s must be > 0")
        for name in ("face_lead_s", "musetalk_face_lead_s"):
            if not 0 <= getattr(self, name) <= 1:
                problems.append(f"{name} must be in 0..1 s, got {getattr(self, name)}")
        if not 0 <= self.face_grace_s <= 0.5:
            problems.append(f"face_grace_s must be in 0..0.5 s, got {self.face_grace_s}")
        if not 0 < self.face_flush_ms <= 1000:
            problems.append(f"face_flush_ms must be in (0, 1000] ms, got {self.face_flush_ms}")
        if self.send_queue_frames < 1:
            problems.append(f"send_queue_frames must be >= 1, got {self.send_queue_frames}")
        if not 0 < self.send_lag_s <= 60:
            problems.append(f"send_lag_s must be in (0, 60] s, got {self.send_lag_s}")
        if self.lease_s <= 2 * self.heartbeat_s:
            problems.append(f"lease_s ({self.lease_s}) must be more than twice heartbeat_s ({self.heartbeat_s})")
        if not 0 <= self.musetalk_right_context_ms <= 2000:
            problems.append(f"musetalk_right_context_ms must be in 0..2000, got {self.musetalk_right_context_ms}")
        if self.avatar_cache_bytes < 1 or self.encode_threads < 0:
            problems.append("avatar_cache_bytes must be >= 1 and encode_threads >= 0")
        if problems:
            raise ValueError("; ".join(problems))
