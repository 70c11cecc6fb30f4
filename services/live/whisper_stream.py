"""The musetalk tier's audio features for a live utterance: whisper's log-mel, computed as the speech
arrives, one window per frame (docs/architecture.md section 12.7).

A job's features are upstream's exactly: the clip's 30 s windows, each normalised by its own maximum
(services/media/whisper_mel.py, `whisper_log_mel_segments`). A live frame cannot wait for 30 s of
audio, so it gets an approximation, built to be the job's numbers wherever it can:

- **the same columns**: `log10_mel(center=False)` over the utterance's 16 kHz samples with the
  extractor's reflect padding in front, so every column is the offline column of the same samples
  (to the last bits of a BLAS product);
- **the same place**: the frame's window is the job's window of the utterance that holds the frame
  (window k = seconds 30k .. 30k + 30 of the utterance, `frame_window`'s rule), so the frame sits at
  the same encoder position, with the same past, as in a job of that utterance. (A window that slid
  with the frame instead, starting a few seconds before it, put the frame at another absolute
  position: measured on real speech, 30 % of the mean token off. The encoder's positions are absolute.)
  Only a frame whose 10 positions run past its window's end (4 frames in 30 s) reads zeros there;
  the job reads on into the next window;
- **a bounded right context**: the window holds the audio up to `right_context_ms` past the last
  sample the frame's own positions reach (132.5 ms after the frame's start at 25 fps: its tenth
  encoder position, the encoder's 3-column receptive field and half an FFT), then the extractor's pad
  value, as if the utterance ended there. So a frame is made once that audio exists: the look-ahead is
  132.5 ms + R (R = 80 ms by default: 212.5 ms, Wav2Lip's). The encoder's attention spans the whole
  window, so the future the job would have seen is what differs (measured: docs/architecture.md);
- **its own maximum**: the 80 dB floor hangs from the window's own maximum, as each job window's does;
- **the end**: a frame whose cut reaches past the utterance's end (once it has ended) has the job's
  columns there (zeros, then the pad value), and positions past floor(seconds x 50) read zeros, as a
  job's do. A window never depends on when it is asked for, only on the utterance's audio.

numpy only (the live worker has no torch); memory bounded by one window (30 s of columns).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from services.live.resample import StreamResampler
from services.media.musetalk_wire import WINDOW_COLUMNS, WINDOW_POSITIONS
from services.media.whisper_mel import (
    DYNAMIC_RANGE,
    HOP_LENGTH,
    MEL_FLOOR,
    N_FFT,
    N_MELS,
    SAMPLE_RATE,
    log10_mel,
)
from services.media.whisper_windows import ITEM_POSITIONS, POSITIONS_PER_SECOND, clip_positions, first_position

#: the default right context past the frame's own audio
RIGHT_CONTEXT_MS = 80.0
HALF = N_FFT // 2  # 200: a column's centre to its window's edges
COLUMNS_PER_POSITION = 2
#: samples past a frame's first position that its 10 positions reach: position q is columns 2q, 2q + 1
#: through the stem's two 3-wide convolutions (stride 2), so it hears column 2q + 2, whose window ends
#: half an FFT past its centre: 160 (2 (q + 9) + 2) + 200 = 320 q + 3400
FRAME_REACH = HOP_LENGTH * COLUMNS_PER_POSITION * (ITEM_POSITIONS - 1 + 1) + HALF
SAMPLES_PER_POSITION = SAMPLE_RATE // POSITIONS_PER_SECOND  # 320
PAD_LOG = math.log10(MEL_FLOOR)  # -10: a column of zeros


def lookahead_ms(right_context_ms: float = RIGHT_CONTEXT_MS, fps: float = 25.0) -> float:
    """How far past a frame's start its whisper window reaches, at most (132.5 ms + R at 25 fps)."""
    worst = max(
        frame_samples(i, fps) - round(i * SAMPLE_RATE / fps) for i in range(0, math.ceil(fps))
    )  # the rule repeats every second
    return 1000.0 * worst / SAMPLE_RATE + right_context_ms


def frame_samples(frame: int, fps: float) -> int:
    """The utterance's 16 kHz samples the frame's own positions reach (FRAME_REACH past its first)."""
    return max(HALF + 1, SAMPLES_PER_POSITION * first_position(frame, fps) + FRAME_REACH)


class FrameWindow(NamedTuple):
    """The whisper window of a run of frames of one session, as an AudioWindow carries it."""

    log_mel: np.ndarray  # (80, columns) float32, normalised; the window's columns after these are `pad_value`
    pad_value: float
    positions: int  # 1..1500 encoder positions carrying audio (the items read no further)
    offsets: tuple[int, ...]  # each frame's first position in the window (MuseTalkItems.offsets), as asked


class WhisperStream:
    """One utterance's speech in (at the session's rate), each frame's whisper window out.

    Frame k (at `fps`, from the utterance's first sample) is `ready` once the audio its window holds
    has arrived (or the utterance has ended); `frame_window([k, ...])` gives the window for a run of frames
    (one window per session per message: the frames' offsets all fall in it; its right context is the
    last frame's). Use one stream per utterance; `finish` ends it.
    """

    def __init__(self, sample_rate: int, fps: float, right_context_ms: float = RIGHT_CONTEXT_MS) -> None:
        if fps <= 0 or not 0 <= right_context_ms <= 2000:
            raise ValueError(f"fps ({fps}) must be > 0 and right_context_ms ({right_context_ms}) in 0..2000")
        self.fps = fps
        self.right_samples = round(right_context_ms * SAMPLE_RATE / 1000)
        self._resampler = StreamResampler(sample_rate, SAMPLE_RATE)
        self._signal = np.zeros(0, np.float32)  # 16 kHz samples from index _signal_offset on
        self._signal_offset = 0
        self._total = 0  # 16 kHz samples received
        self._columns = np.zeros((N_MELS, 0))  # log10 columns from index _column_offset on
        self._column_offset = 0
        self._head: tuple[int, np.ndarray] | None = None  # a window k >= 1's first two columns
        self._ended = False

    @property
    def samples_16k(self) -> int:
        return self._total

    @property
    def ended(self) -> bool:
        return self._ended

    def push(self, samples: np.ndarray) -> None:
        """Appends float samples (at the stream's rate, in [-1, 1))."""
        if self._ended:
            raise RuntimeError("push after finish: use a new WhisperStream per utterance")
        self._append(self._resampler.push(samples))

    def finish(self) -> None:
        """Ends the utterance: the samples after its last are zeros (the job's padding)."""
        if not self._ended:
            self._append(self._resampler.finish())
            self._ended = True

    def cut(self, frame: int) -> int:
        """The utterance's samples frame `frame`'s window holds: its reach plus the right context."""
        return frame_samples(frame, self.fps) + self.right_samples

    def ready(self, frame: int) -> bool:
        return self._ended or self._total >= self.cut(frame)

    def frame_window(self, frames: Sequence[int]) -> FrameWindow:
        """The window of a run of frames (each `ready`; the face link asks once per message): the job's
        window holding the first one's first position, up to the last one's cut."""
        first, last = min(frames), max(frames)
        start = max(0, first_position(first, self.fps)) // WINDOW_POSITIONS * WINDOW_POSITIONS
        cut = self.cut(last)
        last_position = first_position(last, self.fps) + ITEM_POSITIONS  # exclusive
        if self._ended and cut >= self._total:  # past the last sample: the job's zeros (then the pad value)
            end_column = (self._total + HALF - 1) // HOP_LENGTH + 1  # columns holding any audio
            positions = min(last_position, clip_positions(self._total)) - start
        else:  # the columns whose whole FFT window is within the cut (whenever the frame is asked)
            stop = min(self._total, cut)
            end_column = (stop - HALF) // HOP_LENGTH + 1 if stop > HALF else 0
            positions = last_position - start
        first_column = COLUMNS_PER_POSITION * start
        end_column = min(end_column, first_column + WINDOW_COLUMNS)
        columns = self._log_columns(first_column, end_column)
        if start and columns.shape[1] >= 2:  # the job's window k >= 1 is its own clip: reflect-padded at its start
            columns = np.concatenate((self._window_head(first_column), columns[:, 2:]), axis=1)
        top = float(columns.max()) if columns.size else PAD_LOG
        top = max(top, PAD_LOG)  # the pad columns are in the window too
        floor = top - DYNAMIC_RANGE
        if columns.shape[1] == 0:  # nothing heard yet (cannot happen for a ready frame): one pad column
            columns = np.full((N_MELS, 1), PAD_LOG)
        log_mel = ((np.maximum(columns, floor) + 4.0) / 4.0).astype(np.float32)
        pad_value = (max(PAD_LOG, floor) + 4.0) / 4.0
        self._forget(first_column)
        offsets = tuple(first_position(frame, self.fps) - start for frame in frames)
        return FrameWindow(log_mel, float(pad_value), max(1, min(WINDOW_POSITIONS, positions)), offsets)

    # -- the columns ----------------------------------------------------------------------------

    def _append(self, samples: np.ndarray) -> None:
        if len(samples):
            self._signal = np.concatenate((self._signal, samples.astype(np.float32)))
            self._total += len(samples)

    def _log_columns(self, first: int, stop: int) -> np.ndarray:
        """log10 mel columns [first, stop) of the utterance (centred, reflect-padded start), computed once."""
        have = self._column_offset + self._columns.shape[1]
        if stop > have:
            self._extend(have, stop)
        return self._columns[:, max(0, first - self._column_offset) : stop - self._column_offset]

    def _extend(self, have: int, stop: int) -> None:
        """Columns [have, stop): column c is the FFT of samples [160 c - 200, 160 c + 200), the first
        200 reflected as the extractor pads the start, zeros past the end of an ended utterance."""
        begin, end = HOP_LENGTH * have - HALF, HOP_LENGTH * (stop - 1) + HALF
        piece = self._samples(max(0, begin), min(end, self._total))
        if begin < 0:  # the extractor's reflect padding: samples 200 .. 1 in front of sample 0
            head = self._samples(1, HALF + 1)[::-1]
            piece = np.concatenate((head[len(head) + begin :], piece))
        if end > self._total:  # only an ended utterance is asked past its end
            piece = np.concatenate((piece, np.zeros(end - max(begin, self._total), np.float32)))
        new = log10_mel(piece, center=False)
        self._columns = np.concatenate((self._columns, new[:, : stop - have]), axis=1)

    def _window_head(self, first_column: int) -> np.ndarray:
        """The first two columns of a job window that starts at `first_column` > 0: the extractor cuts
        the clip there and pads the cut with its reflection, as at the clip's start (made once per
        window: `_forget` keeps the samples from the next window's start until then)."""
        if self._head is None or self._head[0] != first_column:
            begin = HOP_LENGTH * first_column
            piece = self._samples(begin, min(begin + HOP_LENGTH + HALF, self._total))
            piece = np.concatenate((piece[1 : HALF + 1][::-1], piece))
            self._head = (first_column, log10_mel(piece, center=False)[:, :2])
        return self._head[1]

    def _samples(self, begin: int, end: int) -> np.ndarray:
        if begin < self._signal_offset:
            raise RuntimeError(f"samples from {begin} were dropped (kept from {self._signal_offset})")
        return self._signal[begin - self._signal_offset : end - self._signal_offset]

    def _forget(self, first_column: int) -> None:
        """Drops the columns before `first_column` (later windows start there or later) and the samples
        no column still to be made needs, but for the next window's start (its reflected head)."""
        if first_column > self._column_offset:
            drop = min(first_column - self._column_offset, self._columns.shape[1])
            self._columns = self._columns[:, drop:]
            self._column_offset += drop
        keep = HOP_LENGTH * (self._column_offset + self._columns.shape[1]) - HALF
        keep = min(keep, HOP_LENGTH * (first_column + WINDOW_COLUMNS))  # the next window's reflected head
        if keep > max(self._signal_offset, HALF + 1):
            self._signal = self._signal[keep - self._signal_offset :]
            self._signal_offset = keep
