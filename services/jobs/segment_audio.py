"""What the gateway stores per segment for the render workers: each frame's mel window and its speech
envelope value (services.media.speech), in one blob so a segment is one read and one atomic write.

Layout: the frames' windows (80x16 little-endian float16 each, as the audio stage sent them) back to
back, then one little-endian float16 envelope value per frame. A blob of windows only (written before
the envelope existed) is still read; its envelope is None and the lipsync stage then falls back to
each window's own loudness. A `musetalk` job's blob is the envelope alone (its generator reads the
job's whisper windows, services.jobs.layout.whisper_key; the envelope is its noise gate): `mels` None.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from services.media.wire import MEL_BANDS, MEL_BYTES, MEL_STEP

ENVELOPE_BYTES = 2  # float16 per frame


@dataclasses.dataclass(frozen=True)
class SegmentAudio:
    mels: np.ndarray | None  # (frames, 80, 16) float16; None: the envelope alone (a musetalk job's)
    speech: np.ndarray | None  # (frames,) float16 in [0, 1], or None (an older blob)

    def __len__(self) -> int:
        frames = self.mels if self.mels is not None else self.speech
        return 0 if frames is None else len(frames)


def pack_segment_audio(windows: np.ndarray | None, speech: np.ndarray) -> bytes:
    """(frames, 2560) uint8 window bytes (None: none, a musetalk job's) and (frames,) envelope values -> the blob."""
    if windows is None:
        return np.asarray(speech, "<f2").tobytes()
    if len(windows) != len(speech):
        raise ValueError(f"{len(windows)} windows but {len(speech)} envelope values")
    return windows.tobytes() + np.asarray(speech, "<f2").tobytes()


def unpack_segment_audio(data: bytes, frames: int) -> SegmentAudio:
    windows_only = frames * MEL_BYTES
    if len(data) == frames * ENVELOPE_BYTES and frames:
        return SegmentAudio(None, np.frombuffer(data, dtype="<f2"))
    if len(data) not in (windows_only, windows_only + frames * ENVELOPE_BYTES):
        raise ValueError(
            f"segment audio blob has {len(data)} bytes; {frames} frames need {windows_only + frames * ENVELOPE_BYTES}"
        )
    mels = np.frombuffer(data, dtype="<f2", count=frames * MEL_BANDS * MEL_STEP).reshape(frames, MEL_BANDS, MEL_STEP)
    speech = np.frombuffer(data, dtype="<f2", offset=windows_only) if len(data) > windows_only else None
    return SegmentAudio(mels, speech)
