"""Wav2Lip's mel windows from speech that arrives in chunks: frame k's window as soon as its audio exists.

Why this is exact and what it costs. The whole-clip mel (`services.media.mel.melspectrogram` then
`mel_windows`) is local: column j is the STFT frame of the preemphasised signal centred on sample
200 j (800 samples, reflect padding at both ends of the clip), mapped through the mel basis and a
per-column dB normalisation with fixed levels (ref 20 dB, floor -100 dB: nothing per clip). So a
column depends on samples [200 j - 400, 200 j + 400) and, through the preemphasis
y[n] = x[n] - 0.97 x[n-1] (an FIR filter: its whole state is the previous sample), on sample
200 j - 401. `MelStream` computes new columns by calling `melspectrogram` itself on a slice of the
16 kHz signal that starts `OVERLAP_COLUMNS` hops before the first new column: the slice's own
reflect padding and its x[-1] = 0 reach only those overlap columns, which are discarded; the slice
that starts at sample 0 is the clip's own start, reflect padding included. No formula of the mel is
repeated here, so the streamed columns are the whole clip's numbers (to the last bits of a BLAS
product). At `finish`, the slice ends at the clip's end and its reflect padding is the clip's, so the
tail matches too.

Look-ahead: frame k's window is columns [s, s + 16) with s = int(k * 80 / fps) (s * 200 <= the frame's
first sample 16000 k / fps); its last column needs audio up to sample 200 (s + 15) + 400, at most
`LOOKAHEAD_SAMPLES` = 3,400 samples (`LOOKAHEAD_MS` = 212.5 ms) after the frame's start time k / fps,
exactly that when s * 200 is the frame's first sample (every 5th frame at 25 fps). Input at 24 or
48 kHz adds the resampler's look-ahead (`StreamResampler.delay_samples`, 0.69 ms): see `lookahead_ms`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from services.live.resample import StreamResampler
from services.media.mel import (
    HOP_SIZE,
    MEL_FPS,
    MEL_STEP_SIZE,
    N_FFT,
    SAMPLE_RATE,
    SILENCE_LEVEL,
    frame_count,
    melspectrogram,
)
from services.serving.errors import InvalidMedia

#: Samples after a frame's start time (k / fps) that its mel window needs, at most: its last column
#: (15 hops after the first) reaches half an FFT past its centre.
LOOKAHEAD_SAMPLES = (MEL_STEP_SIZE - 1) * HOP_SIZE + N_FFT // 2
LOOKAHEAD_MS = 1000.0 * LOOKAHEAD_SAMPLES / SAMPLE_RATE  # 212.5

#: Hops recomputed before the first new column: column j's frame starts 2 hops before its centre and
#: its preemphasis reads one sample more, so with 3 hops of overlap no new column sees the slice's edge.
OVERLAP_COLUMNS = 3

PCM_SCALE = 32768.0  # s16le -> [-1, 1)
SUPPORTED_RATES = (16000, 24000, 48000)


def pcm_int16(pcm: bytes) -> np.ndarray:
    """s16le mono bytes -> int16 samples (a read-only view of the bytes).

    Raises:
        InvalidMedia: an odd byte count (a torn sample: the stream is misaligned from there on).
    """
    if len(pcm) % 2:
        raise InvalidMedia(
            f"PCM chunk of {len(pcm)} bytes: s16le samples are 2 bytes each, so a chunk has an even byte count"
        )
    return np.frombuffer(pcm, dtype="<i2")


def pcm_samples(pcm: bytes) -> np.ndarray:
    """s16le mono bytes -> float64 samples in [-1, 1) (exact: every int16 / 32768 is a float). Raises as `pcm_int16`."""
    return pcm_int16(pcm).astype(np.float64) / PCM_SCALE


def check_sample_rate(sample_rate: int) -> None:
    """Raises InvalidMedia for an input rate live sessions do not take."""
    if sample_rate not in SUPPORTED_RATES:
        raise InvalidMedia(
            f"PCM at {sample_rate} Hz: live sessions take s16le mono at {', '.join(map(str, SUPPORTED_RATES))} Hz"
        )


def lookahead_ms(sample_rate: int) -> float:
    """How far behind the input the mel window of a frame can be produced: ms of audio after the frame's start."""
    return LOOKAHEAD_MS + 1000.0 * StreamResampler(sample_rate).delay_samples / sample_rate


def samples_needed(frame: int, fps: float) -> int:
    """16 kHz samples that must exist before `frame`'s window can be computed (before `finish`)."""
    start = int(frame * (MEL_FPS / fps))  # mel_windows's rule, same float expression
    return max(start * HOP_SIZE + LOOKAHEAD_SAMPLES, N_FFT // 2 + 1)  # column 0 reflects sample 400


class MelFrames(NamedTuple):
    """Windows for consecutive frames: ``windows[i]`` belongs to frame ``first + i``."""

    first: int
    windows: np.ndarray  # (n, 80, 16) float32


class MelStream:
    """One utterance's speech in, its frames' mel windows out, in order, as soon as each can be made.

    Frame k (at ``fps``, from the utterance's first sample) gets the window that `mel_windows` gives
    frame k of the whole utterance. Use one stream per utterance: `finish` ends it (the last columns
    see the utterance's end). Memory is bounded: only the samples and columns later frames need are
    kept between calls (3,200 samples at 16 kHz and 16 columns, measured).

    Args:
        sample_rate: the input's rate; resampled to 16 kHz on the fly when it is not 16 kHz.
        fps: the video frame rate.
    """

    def __init__(self, sample_rate: int, fps: float) -> None:
        check_sample_rate(sample_rate)
        if fps <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.sample_rate = sample_rate
        self.fps = fps
        self._multiplier = MEL_FPS / fps
        self._resampler = StreamResampler(sample_rate, SAMPLE_RATE)
        self._signal = np.zeros(0)  # 16 kHz samples from global index _signal_offset on
        self._signal_offset = 0
        self._total = 0  # 16 kHz samples received
        self._columns = np.zeros((80, 0), dtype=np.float32)  # mel columns from index _column_offset on
        self._column_offset = 0
        self._next_frame = 0
        self._finished = False

    @property
    def next_frame(self) -> int:
        """The first frame whose window has not been returned yet."""
        return self._next_frame

    @property
    def samples_16k(self) -> int:
        """16 kHz samples received so far (resampled ones that are exact)."""
        return self._total

    def push_pcm(self, pcm: bytes) -> MelFrames:
        """`push` for s16le bytes."""
        return self.push(pcm_samples(pcm))

    def push(self, samples: np.ndarray) -> MelFrames:
        """Appends input samples (float, at the stream's rate); returns the windows that are now complete."""
        if self._finished:
            raise RuntimeError("push after finish: use a new MelStream per utterance")
        self._append(self._resampler.push(samples))
        ready = self._next_frame
        while samples_needed(ready, self.fps) <= self._total:
            ready += 1
        if ready == self._next_frame:
            return MelFrames(self._next_frame, np.zeros((0, 80, MEL_STEP_SIZE), np.float32))
        last_column = int((ready - 1) * self._multiplier) + MEL_STEP_SIZE  # exclusive
        self._extend_columns(last_column, at_end=False)
        return self._take(ready, self._column_offset + self._columns.shape[1])

    def finish(self, n_frames: int | None = None) -> MelFrames:
        """Ends the utterance: the remaining windows, up to ``n_frames`` in all.

        ``n_frames`` defaults to `frame_count` of the 16 kHz signal (the whole-clip rule). Windows past
        the mel's end repeat its last 16 columns, as `mel_windows` does; an utterance shorter than 16
        columns is padded with the level of silence.
        """
        if self._finished:
            raise RuntimeError("finish called twice")
        self._append(self._resampler.finish())
        self._finished = True
        if self._total == 0:
            return MelFrames(self._next_frame, np.zeros((0, 80, MEL_STEP_SIZE), np.float32))
        total_columns = 1 + self._total // HOP_SIZE
        self._extend_columns(total_columns, at_end=True)
        if n_frames is None:
            n_frames = frame_count(self._total, SAMPLE_RATE, self.fps)
        if total_columns < MEL_STEP_SIZE:  # nothing was dropped: fewer than 16 columns ever existed
            pad = MEL_STEP_SIZE - total_columns
            self._columns = np.pad(self._columns, ((0, 0), (0, pad)), constant_values=SILENCE_LEVEL)
            total_columns = MEL_STEP_SIZE
        return self._take(max(n_frames, self._next_frame), total_columns)

    def _append(self, samples: np.ndarray) -> None:
        if len(samples):
            self._signal = np.concatenate((self._signal, samples))
            self._total += len(samples)

    def _extend_columns(self, stop: int, at_end: bool) -> None:
        """Computes columns up to ``stop`` (exclusive) from the kept samples; at_end: the signal is complete."""
        have = self._column_offset + self._columns.shape[1]
        if stop <= have:
            return
        # A slice from sample 0 is the clip's own start; later ones start OVERLAP_COLUMNS hops early.
        skip = min(have, OVERLAP_COLUMNS)
        begin = (have - skip) * HOP_SIZE
        end = self._total if at_end else (stop - 1) * HOP_SIZE + N_FFT // 2
        piece = self._signal[begin - self._signal_offset : end - self._signal_offset]
        mel = melspectrogram(piece)
        new = mel[:, skip : skip + stop - have]
        self._columns = np.concatenate((self._columns, new), axis=1)

    def _take(self, stop_frame: int, total_columns: int) -> MelFrames:
        """Windows of frames [next_frame, stop_frame), then drops what later frames cannot need."""
        first = self._next_frame
        windows = np.empty((stop_frame - first, 80, MEL_STEP_SIZE), dtype=np.float32)
        for i, frame in enumerate(range(first, stop_frame)):
            start = min(int(frame * self._multiplier), total_columns - MEL_STEP_SIZE) - self._column_offset
            windows[i] = self._columns[:, start : start + MEL_STEP_SIZE]
        self._next_frame = stop_frame
        have = self._column_offset + self._columns.shape[1]
        # Keep the next frame's columns, and the last 16 (finish may clamp a window onto them).
        keep_columns = max(0, min(int(stop_frame * self._multiplier), have - MEL_STEP_SIZE))
        if keep_columns > self._column_offset:
            self._columns = self._columns[:, keep_columns - self._column_offset :]
            self._column_offset = keep_columns
        keep_samples = max(0, (have - OVERLAP_COLUMNS) * HOP_SIZE)
        if keep_samples > self._signal_offset:
            self._signal = self._signal[keep_samples - self._signal_offset :]
            self._signal_offset = keep_samples
        return MelFrames(first, windows)
