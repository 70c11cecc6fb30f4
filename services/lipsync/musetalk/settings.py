"""Settings of the lipsync-musetalk stage (`python -m services.lipsync.musetalk`): its flags and
`LIPLINE_*` variables, apart from the service as every stage's (the chart's values schema reads them).

The checkpoints are paths, as Wav2Lip's `checkpoint` is, in the public MuseTalk layout
(docs/architecture.md section 12): the generator needs all four of `unet`, `unet_config`, `vae` and
`whisper` (or none: the weight-free stand-in); `face_parser` and `dwpose` are each optional (an
elliptical mask; boxes from the face detector). A file that does not fit fails start-up naming its
missing and unexpected keys (the loaders in services/lipsync/musetalk/).
"""

from __future__ import annotations

import dataclasses

from services.lipsync.settings import CoveredMouthSettings
from services.serving.settings import setting
from services.serving.stages import STAGES

_STAGE = STAGES["lipsync-musetalk"]
#: the settings naming checkpoint files or folders (the chart prefixes them with the models volume's mount path)
PATH_SETTINGS = ("unet", "unet_config", "vae", "whisper", "face_parser", "dwpose")
GENERATOR_SETTINGS = ("unet", "unet_config", "vae", "whisper")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


@dataclasses.dataclass(frozen=True)
class MuseTalkSettings(CoveredMouthSettings):
    """Settings of the lipsync-musetalk stage: the 256 px generator tier in the MuseTalk 1.5 format (with the
    covered-mouth check's settings, as the lipsync stage's: PrepareAvatar runs the same check)."""

    port: int = setting(_STAGE.port, "gRPC port")
    metrics_port: int = setting(_STAGE.metrics_port, "Prometheus /metrics HTTP port (0 = any free port, -1 = off)")
    unet: str = setting(
        "",
        "musetalkV15/unet.pth (the UNet's state dict); with unet_config, vae and whisper the MuseTalk 1.5 generator; "
        "all four empty = the weight-free 'musetalk-standin'",
    )
    unet_config: str = setting("", "musetalk.json (the UNet's diffusers config) beside unet.pth")
    vae: str = setting(
        "", "the sd-vae folder (sd-vae-ft-mse in diffusers format: config.json + diffusion_pytorch_model.bin)"
    )
    whisper: str = setting("", "the whisper folder (openai/whisper-tiny in HF format; its encoder is used)")
    face_parser: str = setting(
        "",
        "face-parse-bisent/79999_iter.pth (BiSeNet): the avatars' 'jaw' masks; empty = an elliptical lower-face mask",
    )
    dwpose: str = setting(
        "", "dwpose/dw-ll_ucoco_384.pth: the avatars' face boxes from landmarks; empty = from the face detector's box"
    )
    max_batch: int = setting(
        32, "largest model batch (one UNet + VAE decode pass; ~500 frames/s compiled on an H200 from 16 up)"
    )
    max_latents_per_stream: int = setting(4096, "latents one Generate stream may register")
    max_window_positions: int = setting(
        32000,
        "encoder positions one Generate stream may hold in its audio windows (1500 per 30 s window, 3.8 KB each in "
        "fp16 on the GPU; a live worker's stream holds up to 1500 per session: 32,000 covers 21); a window past it "
        "is RESOURCE_EXHAUSTED (replace windows by index instead)",
    )
    max_windows_per_batch: int = setting(4, "largest whisper encoder batch (windows encoded in one pass)")
    max_prepare_frames: int = setting(3000, "frames one PrepareAvatar stream may send")
    precision: str = setting("", "fp32, fp16 or bf16; empty = the backend's default (fp16 on CUDA, fp32 on CPU)")
    fast_decode: bool = setting(
        False,
        "decode only latent rows 12-31 (the face's pixel rows 96-255, the rows the avatar's alpha uses; the rows "
        "above are black): ~40 % more frames/s on an H200, not exact (the VAE decoder's attention is global); "
        "reported as the model 'musetalk+fast-decode'",
    )
    compile_mode: str = setting(
        "default",
        "torch.compile mode of backend=compile (Inductor 'default' compiles UNet + VAE in about a minute per "
        "bucket; 'max-autotune-no-cudagraphs' ran for more than 8 minutes)",
    )

    @property
    def has_generator(self) -> bool:
        """The real MuseTalk 1.5 generator (else the weight-free stand-in)."""
        return all(getattr(self, name) for name in GENERATOR_SETTINGS)

    def validate(self) -> None:
        super().validate()
        problems = []
        given = [name for name in GENERATOR_SETTINGS if getattr(self, name)]
        if given and len(given) != len(GENERATOR_SETTINGS):
            missing = [name for name in GENERATOR_SETTINGS if name not in given]
            problems.append(
                f"unet, unet_config, vae and whisper go together (the MuseTalk 1.5 generator) or none is set "
                f"(the weight-free stand-in): {', '.join(given)} given, {', '.join(missing)} missing"
            )
        if self.max_latents_per_stream < 1 or self.max_prepare_frames < 1 or self.max_windows_per_batch < 1:
            problems.append("max_latents_per_stream, max_prepare_frames and max_windows_per_batch must be >= 1")
        if self.max_window_positions < 1500:
            problems.append(f"max_window_positions must be >= 1500 (one whole window), got {self.max_window_positions}")
        if self.compile_mode not in COMPILE_MODES:
            problems.append(f"compile_mode {self.compile_mode!r} is not one of {', '.join(COMPILE_MODES)}")
        if problems:
            raise ValueError("; ".join(problems))
