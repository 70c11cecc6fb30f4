"""A weight-free stand-in for Wav2Lip: opens the reference face's mouth in step with speech energy.

Used when no Wav2Lip checkpoint is configured, so the service and demo still produce a visibly
talking face. Same tensor contract as `Wav2Lip`: mel windows (B, 1, 80, 16) in [-4, 4] and faces
(B, 6, 96, 96) in [0, 1] -> (B, 3, 96, 96) in [0, 1], BGR; plus an optional third input, the clip's
speech envelope (B,) in [0, 1] (services/media/speech.py: normalised per clip, gated on its noise
floor, attack/release smoothed), NaN where a client sent none. The opening is that envelope; only
without it does the model fall back to the window's own absolute loudness (which cannot tell noise
from quiet speech, docs/quality.md). Pure torch, batched, deterministic, runs on any device.

The mouth line is found in each reference crop: the narrowest dark row (the gap between the lips)
near the expected lip height, not a fixed row (faces' lip lines measured at rows 61-66 of 96).

The effect, per item, for an opening o in [0, 1]:
- a vertical warp of the lower face (grid_sample): below the mouth line content moves down (lower
  lip and jaw drop), above it moves up a little (upper lip); the displacement fades to zero at the
  crop's bottom row, at `UPPER_FIXED_Y` and sideways beyond `JAW_HALF_WIDTH`, so the hard paste
  back into the frame shows no seam;
- a dark inner-mouth ellipse filling the gap between the lips, its height proportional to o.
Pixels the effect does not touch are copied from the reference bit for bit (silence is a no-op).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from services.media.speech import ABSOLUTE_CLOSED_LEVEL, ABSOLUTE_OPEN_LEVEL, FRAME_COLUMNS, SPEECH_BANDS

__all__ = ["ProceduralLipSync"]

# Geometry in pixels of the 96x96 Wav2Lip crop (S3FD-like box + 10 px bottom pad): the mouth is
# horizontally centred; its line is found per crop (`lip_line`). Scaled for other crop sizes.
REF_SIZE = 96.0
MOUTH_CX = 48.0
UPPER_FIXED_Y = 44.0  # rows above this never move (eyes, nose)
JAW_HALF_WIDTH = 30.0  # horizontal extent of the warp (cos^2 falloff to 0 at this distance)
LIP_DROP_MAX = 7.0  # lower lip / jaw displacement at full opening
LIP_RAISE_MAX = 2.0  # upper lip displacement at full opening
MOUTH_HALF_WIDTH = 15.0  # inner-mouth ellipse half width
INNER_MOUTH_BGR = (0.10, 0.08, 0.22)  # dark red-brown, BGR like everything else
MAX_DARKNESS = 0.85  # blend weight of the inner-mouth colour at the ellipse centre
EDGE_SOFTNESS = 0.35  # fraction of the ellipse radius over which the darkening fades out
MIN_VISIBLE_HALF_HEIGHT = 1.5  # px; smaller openings fade the ellipse in instead of a hard line
# The lip-line search: rows LIP_ROWS of the crop, over the central columns +-LIP_HALF_WIDTH; a row's
# score is its darkness against the rows LIP_VALLEY px above and below (a narrow valley: the lip gap,
# not a broad dark beard or the nostrils' shadow), less LIP_PRIOR per pixel away from LIP_PRIOR_Y.
LIP_ROWS = (58, 75)
LIP_HALF_WIDTH = 14
LIP_VALLEY = 3
LIP_PRIOR_Y = 64.0
LIP_PRIOR = 1.0 / 255.0

# Without an envelope, the window's own speech-band level (services.media.speech's bands, columns
# and fixed levels: the frame's first 50 ms, in sync with the picture). Below CLOSED_LEVEL the mouth
# is shut; at OPEN_LEVEL and above open.
CLOSED_LEVEL = ABSOLUTE_CLOSED_LEVEL
OPEN_LEVEL = ABSOLUTE_OPEN_LEVEL


class ProceduralLipSync(nn.Module):
    """Speech-energy-driven mouth opening; a drop-in for `Wav2Lip` with no weights."""

    model_name = "procedural"
    reads_speech = True  # LipSyncEngine passes the clip's speech envelope as a third input

    def opening(self, audio_sequences: torch.Tensor) -> torch.Tensor:
        """(B, 1, 80, 16) mel windows -> (B,) mouth opening in [0, 1] by each window's own loudness
        (0 for silence): the fallback when no clip envelope came with the items."""
        level = audio_sequences[:, 0, SPEECH_BANDS, FRAME_COLUMNS].float().mean(dim=(1, 2))
        return ((level - CLOSED_LEVEL) / (OPEN_LEVEL - CLOSED_LEVEL)).clamp(0.0, 1.0)

    @staticmethod
    def lip_line(ref: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) BGR reference faces -> (B, 1, 1) row of the lip line, in pixels of the crop."""
        height, width = ref.shape[2:]
        sy, sx = height / REF_SIZE, width / REF_SIZE
        luma = (ref.float() * torch.tensor([0.114, 0.587, 0.299], device=ref.device).view(1, 3, 1, 1)).sum(1)
        c0, c1 = round((MOUTH_CX - LIP_HALF_WIDTH) * sx), round((MOUTH_CX + LIP_HALF_WIDTH) * sx) + 1
        profile = luma[:, :, c0:c1].mean(dim=2)  # (B, H)
        gap = max(1, round(LIP_VALLEY * sy))
        r0, r1 = round(LIP_ROWS[0] * sy), min(round(LIP_ROWS[1] * sy), height - 1 - gap)
        rows = torch.arange(r0, r1 + 1, device=ref.device)
        valley = profile[:, rows] - 0.5 * (profile[:, rows - gap] + profile[:, rows + gap])
        prior = LIP_PRIOR * (rows.float() - LIP_PRIOR_Y * sy).abs() / sy
        best = (valley + prior).argmin(dim=1)
        return rows[best].float().view(-1, 1, 1)

    def forward(
        self, audio_sequences: torch.Tensor, face_sequences: torch.Tensor, speech: torch.Tensor | None = None
    ) -> torch.Tensor:
        ref = face_sequences[:, 3:6]
        batch, _, height, width = ref.shape
        device = ref.device
        sy, sx = height / REF_SIZE, width / REF_SIZE
        cx, cy = MOUTH_CX * sx, self.lip_line(ref)  # cy: (B, 1, 1)
        y_fixed, y_bottom = UPPER_FIXED_Y * sy, height - 1.0

        o = self.opening(audio_sequences).to(device)
        if speech is not None:
            speech = speech.to(device=device, dtype=o.dtype)
            o = torch.where(torch.isfinite(speech), speech.clamp(0.0, 1.0), o)
        o = o.view(batch, 1, 1)
        ys = torch.arange(height, device=device, dtype=torch.float32).view(1, height, 1)
        xs = torch.arange(width, device=device, dtype=torch.float32).view(1, 1, width)

        # Horizontal profile of the warp: 1 at the mouth centre, smoothly 0 at the jaw edges.
        u = ((xs - cx) / (JAW_HALF_WIDTH * sx)).clamp(-1.0, 1.0)
        profile = torch.cos(u * (torch.pi / 2)) ** 2
        # Vertical weights: full at the mouth line, 0 at the fixed row above and at the bottom row.
        w_low = ((y_bottom - ys) / (y_bottom - cy)).clamp(0.0, 1.0) * (ys >= cy)
        w_up = ((ys - y_fixed) / (cy - y_fixed)).clamp(0.0, 1.0) * (ys < cy)
        drop, raise_ = LIP_DROP_MAX * sy * o, LIP_RAISE_MAX * sy * o
        # Backward map: output row y samples source row y - shift (positive shift = moved down).
        # Both branches are monotonic in y, so nothing folds; the gap opening at the mouth line
        # samples stretched lip texture and is painted over by the inner-mouth ellipse below.
        shift = profile * (drop * w_low - raise_ * w_up)  # (B, H, W)
        src_y = ys - shift
        grid = torch.stack(
            (
                (2.0 * xs / (width - 1) - 1.0).expand(batch, height, width),
                2.0 * src_y / (height - 1) - 1.0,
            ),
            dim=-1,
        ).to(ref.dtype)
        warped = F.grid_sample(ref, grid, mode="bilinear", padding_mode="border", align_corners=True)

        # Inner mouth: an ellipse spanning the gap between the moved lips.
        half_h = 0.5 * (drop + raise_)  # (B, 1, 1)
        centre_y = cy + 0.5 * (drop - raise_)
        r = torch.sqrt(((xs - cx) / (MOUTH_HALF_WIDTH * sx)) ** 2 + ((ys - centre_y) / half_h.clamp_min(1e-3)) ** 2)
        alpha = ((1.0 - r) / EDGE_SOFTNESS).clamp(0.0, 1.0) * MAX_DARKNESS
        alpha = alpha * (half_h / MIN_VISIBLE_HALF_HEIGHT).clamp(0.0, 1.0)  # (B, H, W)
        alpha = alpha.unsqueeze(1).to(ref.dtype)
        colour = torch.tensor(INNER_MOUTH_BGR, device=device, dtype=ref.dtype).view(1, 3, 1, 1)
        out = warped * (1.0 - alpha) + colour * alpha

        # Untouched pixels are copied exactly: grid_sample's identity is only exact up to rounding.
        touched = ((shift != 0) | (alpha[:, 0] > 0)).unsqueeze(1)
        return torch.where(touched, out, ref).clamp(0.0, 1.0)
