"""How open a weight-free mouth should be, frame by frame, from a whole clip's mel windows.

Wav2Lip reads each frame's 0.2 s mel window on its own, which is what its weights were trained on.
A mouth with no weights cannot: one window holds 160 ms of future and no past, and nothing in it says
how loud this recording is or how loud its background noise is (measured in docs/quality.md: -40
dBFS pink noise reads as loud as speech recorded 20 dB quieter). So the gateway, which holds every
window of the clip at SubmitJob, computes the envelope once per clip:

1. the frame's speech-band level (bands ~150 Hz-4 kHz of the window's first 50 ms, mel columns 0-3);
2. normalised per clip: 0 at the estimated noise floor (a low percentile of the levels: the pauses),
   1 at the speech level (a high percentile), over at most 25 dB; a clip whose level hardly varies
   is steady sound (silence, hum, noise), never speech;
3. gated: the mouth stays shut below `GATE` of that range, so steady background noise never opens
   it, and opens fully at `GATE + SPAN`;
4. smoothed with attack/release (fast opening, slower closing), as a lip moves, in seconds so any
   frame rate gives the same motion.

The result travels with each item to the lipsync stage (`GenerateItems.speech`); the procedural
model opens the mouth by it, models with weights ignore it. The musetalk tier's workers gate by it
(`gate_weights`): where it is shut the template's own mouth shows, no face is asked for.
numpy only: the gateway has no torch.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "ABSOLUTE_CLOSED_LEVEL",
    "ABSOLUTE_OPEN_LEVEL",
    "StreamingEnvelope",
    "gate_weights",
    "speech_envelope",
    "speech_levels",
]

SPEECH_BANDS = slice(4, 64)  # mel bands ~150 Hz..4 kHz of the 80 spanning 55..7600 Hz
FRAME_COLUMNS = slice(0, 4)  # a window starts at its frame's time: columns 0-3 are its first 50 ms
FLOOR_PERCENTILE = 10.0  # the noise floor: the quietest tenth of the clip (its pauses)
PEAK_PERCENTILE = 95.0  # the speech level
MIN_RANGE = 0.8  # 10 dB: a clip that varies less is steady sound (noise, hum, silence), not speech
MAX_RANGE = 2.0  # 25 dB: sound further below the speech level counts as silence, however clean the pauses
GATE = 0.25  # fraction of the floor-to-speech range that keeps the mouth shut
SPAN = 0.7  # fraction over which it opens from shut to fully open
ATTACK_S = 0.05  # opening time constant
RELEASE_S = 0.07  # closing time constant
SHUT = 0.1  # a release tail below this is 0: a shut mouth is exactly the reference face
# Without the whole clip (a live session, or a window alone): the frame's speech-band level against
# fixed levels in Wav2Lip's [-4, 4] scale (-4 = -100 dB). Measured on synthetic signals: a -60..-50
# dBFS noise floor averages -3.1..-2.3, voiced speech at -30/-20 dBFS about -1.6/-0.85. Shut below
# the first, fully open at the second.
ABSOLUTE_CLOSED_LEVEL = -2.5
ABSOLUTE_OPEN_LEVEL = -0.5


def speech_levels(windows: np.ndarray) -> np.ndarray:
    """(frames, 80, 16) mel windows in Wav2Lip's [-4, 4] scale -> (frames,) speech-band level."""
    return windows[:, SPEECH_BANDS, FRAME_COLUMNS].astype(np.float32).mean(axis=(1, 2))


def _normalised(levels: np.ndarray) -> np.ndarray:
    floor = float(np.percentile(levels, FLOOR_PERCENTILE))
    peak = float(np.percentile(levels, PEAK_PERCENTILE))
    if peak - floor < MIN_RANGE:  # speech, even without pauses, swings more between syllables
        return np.zeros_like(levels)
    floor = max(floor, peak - MAX_RANGE)
    return (levels - floor) / (peak - floor)


def _attack_release(target: np.ndarray, fps: float) -> np.ndarray:
    attack = 1.0 - np.exp(-1.0 / (fps * ATTACK_S))
    release = 1.0 - np.exp(-1.0 / (fps * RELEASE_S))
    out = np.empty_like(target)
    y = 0.0
    for i, x in enumerate(target.tolist()):
        y += (attack if x > y else release) * (x - y)
        out[i] = y
    return out


def speech_envelope(windows: np.ndarray, fps: float) -> np.ndarray:
    """(frames, 80, 16) mel windows of one whole clip -> (frames,) float32 opening in [0, 1]."""
    if len(windows) == 0:
        return np.zeros(0, np.float32)
    target = np.clip((_normalised(speech_levels(windows)) - GATE) / SPAN, 0.0, 1.0)
    envelope = _attack_release(target.astype(np.float32), fps)
    envelope[envelope < SHUT] = 0.0
    return envelope.astype(np.float32)


#: the musetalk tier's gate: its generated mouth is blended in proportion to the envelope up to this
#: value, fully above (services.media.composite's `weight`): at the envelope's 50 ms attack that is a
#: fade-in of about two frames, at its 70 ms release a fade-out of two to three, and a shut envelope
#: (0: silence, steady noise) shows the template's own mouth, never a generated one.
GATE_FULL = 0.3


def gate_weights(envelope: np.ndarray) -> np.ndarray:
    """(frames,) envelope in [0, 1] -> (frames,) float32 blend weight of a generated mouth (0: the template's)."""
    return np.clip(np.asarray(envelope, np.float32) / GATE_FULL, 0.0, 1.0)


class StreamingEnvelope:
    """`speech_envelope` for frames that come one at a time (a live utterance): each frame's level
    against the fixed ABSOLUTE_* levels (no clip to normalise by: quiet speech under loud noise is
    not told apart, as the procedural model's fallback), the same attack/release and shut tail.
    `reset` when the speech stops (a Clear): the next frame starts shut."""

    def __init__(self, fps: float) -> None:
        self._attack = 1.0 - np.exp(-1.0 / (fps * ATTACK_S))
        self._release = 1.0 - np.exp(-1.0 / (fps * RELEASE_S))
        self._y = 0.0

    def reset(self) -> None:
        self._y = 0.0

    def next(self, window: np.ndarray) -> float:
        """One frame's (80, 16) mel window -> its opening in [0, 1] (0: shut)."""
        level = float(speech_levels(np.asarray(window)[None])[0])
        target = min(1.0, max(0.0, (level - ABSOLUTE_CLOSED_LEVEL) / (ABSOLUTE_OPEN_LEVEL - ABSOLUTE_CLOSED_LEVEL)))
        self._y += (self._attack if target > self._y else self._release) * (target - self._y)
        return self._y if self._y >= SHUT else 0.0
