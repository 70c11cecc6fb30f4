"""Settings of the lipsync service (`python -m services.lipsync`): its flags and `LIPLINE_*` variables.

Apart from the service so that what reads settings (the chart's values schema, `--help`, the stage
registry) finds them in one place per service, as the gateway and render do.
"""

from __future__ import annotations

import dataclasses

from services.serving.settings import ModelStageSettings, setting
from services.serving.stages import STAGES


@dataclasses.dataclass(frozen=True)
class CoveredMouthSettings(ModelStageSettings):
    """A model stage that prepares avatars: the covered-mouth check's thresholds (services/lipsync/occlusion.py).

    One home for both tiers' stages (lipsync's DetectFaces, lipsync-musetalk's PrepareAvatar), so the
    same names, defaults and checks reach both (docs/architecture.md sections 2 and 12.4).
    """

    occlusion_check: bool = setting(
        True,
        "avatar preparation: frames whose lower face is hidden (hand, microphone, card) pass through unchanged",
    )
    occlusion_mad_k: float = setting(
        4.0, "a frame's lower face is covered above median + k * MAD of the avatar's scores"
    )
    occlusion_min_score: float = setting(0.8, "absolute floor of the covered-mouth threshold (a nearly still avatar)")
    occlusion_dilate: int = setting(2, "frames added on each side of a covered run (no flicker at its edges)")

    def validate(self) -> None:
        super().validate()
        if self.occlusion_mad_k <= 0 or self.occlusion_min_score < 0 or self.occlusion_dilate < 0:
            raise ValueError(
                f"occlusion_mad_k must be > 0, occlusion_min_score and occlusion_dilate >= 0; got "
                f"{self.occlusion_mad_k}, {self.occlusion_min_score}, {self.occlusion_dilate}"
            )


@dataclasses.dataclass(frozen=True)
class LipSyncSettings(CoveredMouthSettings):
    """Settings of the lipsync service."""

    port: int = setting(STAGES["lipsync"].port, "gRPC port")
    metrics_port: int = setting(
        STAGES["lipsync"].metrics_port, "Prometheus /metrics HTTP port (0 = any free port, -1 = off)"
    )
    checkpoint: str = setting("", "wav2lip.pth / wav2lip_gan.pth; empty = the weight-free 'procedural' model")
    max_batch: int = setting(128, "largest model batch (Wav2Lip's inference default)")
    max_crops_per_stream: int = setting(4096, "reference crops one Generate stream may register")
    max_detect_frames: int = setting(3000, "frames one DetectFaces stream may send")
    detector: str = setting("haar", "face detector for DetectFaces: haar (OpenCV's bundled cascade) or none")
    precision: str = setting("", "fp32, fp16 or bf16; empty = the backend's default (fp16 on CUDA, fp32 on CPU)")
