"""Settings of the superres service (`python -m services.superres`): its flags and `LIPLINE_*` variables.

Apart from the service so that what reads settings (the chart's values schema, `--help`, the stage
registry) finds them in one place per service, as the gateway and render do.
"""

from __future__ import annotations

import dataclasses

from services.serving.settings import ModelStageSettings, setting
from services.serving.stages import STAGES


@dataclasses.dataclass(frozen=True)
class SuperResSettings(ModelStageSettings):
    """Settings of the superres service."""

    port: int = setting(STAGES["superres"].port, "gRPC port")
    metrics_port: int = setting(
        STAGES["superres"].metrics_port, "Prometheus /metrics HTTP port (0 = any free port, -1 = off)"
    )
    model: str = setting("realesr-general-x4v3", "SR model name, or 'lanczos' for the weight-free resize")
    checkpoint: str = setting("", "Real-ESRGAN .pth file; empty = the weight-free 'lanczos' fallback")
    max_batch: int = setting(64, "largest model batch")
