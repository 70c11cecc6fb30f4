"""Settings of the audio service (`python -m services.audio`): its flags and `LIPLINE_*` variables.

Apart from the service so that what reads settings (the chart's values schema, `--help`, the stage
registry) finds them in one place per service, as the gateway and render do.
"""

from __future__ import annotations

import dataclasses

from services.audio.extract import MAX_PROCESSES
from services.serving.settings import ServiceSettings, setting
from services.serving.stages import STAGES


@dataclasses.dataclass(frozen=True)
class AudioSettings(ServiceSettings):
    """Settings of the audio service."""

    port: int = setting(STAGES["audio"].port, "gRPC port")
    metrics_port: int = setting(
        STAGES["audio"].metrics_port, "Prometheus /metrics HTTP port (0 = any free port, -1 = off)"
    )
    max_audio_bytes: int = setting(100 * 1024 * 1024, "largest accepted audio file")
    max_audio_seconds: float = setting(900.0, "longest accepted audio")
    extract_processes: int = setting(
        1,
        "child processes that decode uploads and compute their mel windows, one clip each at a time in arrival order "
        "(a decoder crash fails only its request); 0 = one thread in the server process",
    )

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.extract_processes <= MAX_PROCESSES:
            raise ValueError(f"extract_processes {self.extract_processes} is not in 0..{MAX_PROCESSES}")
