"""Wav2Lip's mel spectrogram and its per-video-frame windows, reproduced exactly without librosa.

Why this module exists: the Wav2Lip generator was trained on mels from `audio.melspectrogram` running on
librosa 0.7.0. librosa 0.11 changed defaults that code relied on silently (STFT `pad_mode` reflect ->
zero padding, which changes the edge frames; complex64 -> input-matched output; positional arguments of
`filters.mel` rejected), so calling it "the same way" today gives different numbers. Here every such
step is written out in numpy and scipy (the filter bank in `services.media.mel_filters`, which says why
librosa is not called at run time), and tests compare against numbers recorded from the original code
(tests/data/reference/mel_vector.npz, audio_hparams.json) and against librosa itself.
"""

from __future__ import annotations

import functools

import numpy as np
import scipy.fft
from scipy import signal as sps

from services.media.mel_filters import slaney_mel_filters
from services.serving.errors import InvalidMedia

SAMPLE_RATE = 16000
N_FFT = 800
HOP_SIZE = 200
WIN_SIZE = 800
NUM_MELS = 80
FMIN = 55
FMAX = 7600
PREEMPHASIS = 0.97
MIN_LEVEL_DB = -100
REF_LEVEL_DB = 20
MAX_ABS_VALUE = 4.0
MEL_STEP_SIZE = 16  # columns per model input window
MEL_FPS = 80.0  # mel columns per second = SAMPLE_RATE / HOP_SIZE
SILENCE_LEVEL = -MAX_ABS_VALUE  # normalised value of a column at or below the -100 dB floor


@functools.lru_cache(maxsize=1)
def mel_basis() -> np.ndarray:
    """The Slaney mel filterbank, shape (80, 401), float32, built once: Wav2Lip's
    `librosa.filters.mel(sr, n_fft, n_mels=80, fmin=55, fmax=7600)` on librosa 0.7, whose `norm=1`
    was Slaney area normalisation (modern librosa's `norm="slaney"`; its `norm=1` means L1)."""
    basis = slaney_mel_filters(SAMPLE_RATE, N_FFT, NUM_MELS, FMIN, FMAX, np.float32)
    basis.setflags(write=False)  # shared by every caller via the cache
    return basis


@functools.lru_cache(maxsize=1)
def _hann_window() -> np.ndarray:
    """The periodic Hann window librosa's `get_window("hann", 800, fftbins=True)` returns (float64)."""
    window = sps.get_window("hann", WIN_SIZE, fftbins=True)
    window.setflags(write=False)
    return window


def stft_magnitude(emphasized: np.ndarray) -> np.ndarray:
    """|STFT| of the preemphasised signal, shape (401, 1 + n // 200), float32, as Wav2Lip computes it:
    `librosa.stft(y, n_fft=800, hop_length=200, win_length=800, window="hann", center=True,
    pad_mode="reflect", dtype=complex64)` (librosa 0.7.0's defaults spelled out: 0.11 would zero-pad).

    Why not call librosa: its per-call overhead (window built anew, three pads and framings, argument
    checks) is ~0.3 ms, ten times the transform on the short slices a live session's incremental mel
    takes about 25 times a second per session. The same steps are written out here, so the numbers are librosa's to the
    bit: the signal reflect-padded by 400 at both ends, 800-sample frames every 200 samples times the
    window, scipy's real FFT (librosa's default FFT library) in float64, rounded to complex64, the
    magnitude laid out (frequency, time) in Fortran order as librosa's matrix is (the mel basis product
    then sums in the same order). tests/unit/media/test_mel.py checks it against librosa.stft.
    """
    padded = np.pad(emphasized, N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP_SIZE]
    spectrum = scipy.fft.rfft(frames * _hann_window(), axis=-1).astype(np.complex64)
    return np.abs(spectrum).T


def melspectrogram(signal: np.ndarray) -> np.ndarray:
    """Wav2Lip's `audio.melspectrogram`, normalised to [-4, 4].

    Args:
        signal: mono samples at 16 kHz, shape (num_samples,), any float dtype.

    Returns:
        Shape (80, 1 + num_samples // 200), float32.

    Raises:
        InvalidMedia: empty, non-1-D or non-finite input, or a result containing NaN (Wav2Lip
            aborts there too).
    """
    signal = np.asarray(signal)
    if signal.ndim != 1 or signal.size == 0:
        raise InvalidMedia(f"audio must be a non-empty mono signal, got shape {signal.shape}")
    if not np.isfinite(signal).all():  # librosa would raise its own ParameterError
        raise InvalidMedia("audio contains NaN or infinite samples")
    # Preemphasis y[n] = x[n] - 0.97 x[n-1], x[-1] = 0; lfilter returns float64.
    emphasized = sps.lfilter([1.0, -PREEMPHASIS], [1.0], signal)
    mel = mel_basis() @ stft_magnitude(emphasized)
    min_level = np.exp(MIN_LEVEL_DB / 20 * np.log(10))  # 1e-5, the -100 dB floor
    db = 20 * np.log10(np.maximum(min_level, mel)) - REF_LEVEL_DB
    out = np.clip(
        2 * MAX_ABS_VALUE * (db - MIN_LEVEL_DB) / -MIN_LEVEL_DB - MAX_ABS_VALUE, -MAX_ABS_VALUE, MAX_ABS_VALUE
    ).astype(np.float32)
    if np.isnan(out).any():
        raise InvalidMedia("audio produced NaN in the mel spectrogram (non-finite samples?)")
    return out


def mel_chunks(mel: np.ndarray, fps: float) -> np.ndarray:
    """Wav2Lip inference.py's chunking, verbatim: one 16-column window per video frame.

    Window i starts at int(i * 80/fps); at the first window that would run past the end, the last 16
    columns are taken instead and the loop stops (so the tail may repeat or overlap its predecessor).

    Args:
        mel: shape (80, T).
        fps: video frame rate.

    Returns:
        Shape (N, 80, 16), float32.

    Raises:
        InvalidMedia: T < 16 (upstream would emit a narrower chunk that cannot be batched).
    """
    total = mel.shape[1]
    if total < MEL_STEP_SIZE:
        raise InvalidMedia(f"audio too short: {total} mel columns, need at least {MEL_STEP_SIZE} (~0.2 s of audio)")
    multiplier = MEL_FPS / fps  # computed first, as upstream does, so truncation matches bit for bit
    chunks = []
    i = 0
    while True:
        start = int(i * multiplier)
        if start + MEL_STEP_SIZE > total:
            chunks.append(mel[:, total - MEL_STEP_SIZE :])
            break
        chunks.append(mel[:, start : start + MEL_STEP_SIZE])
        i += 1
    return np.stack(chunks).astype(np.float32, copy=False)


def frame_count(num_samples: int, sample_rate: int, fps: float) -> int:
    """Output video frames for a clip: round(duration * fps), at least 1.

    Rounding (not Wav2Lip's chunk count) keeps the video's duration within half a frame of the audio's.
    """
    return max(1, round(num_samples / sample_rate * fps))


def mel_windows(mel: np.ndarray, fps: float, n_frames: int) -> np.ndarray:
    """One 16-column mel window per output frame: Wav2Lip's rule generalised to any frame count.

    Window i starts at int(i * 80/fps) clamped to T-16, so every window that would run past the end is
    the last 16 columns (Wav2Lip's tail chunk, repeated as needed). A mel narrower than 16 columns is
    first padded on the right with -4.0, the normalised level of silence.

    For n_frames == len(mel_chunks(mel, fps)) the result equals mel_chunks exactly: the regular
    chunks have start <= T-16 (unclamped), and the tail chunk is exactly the clamped window.

    Args:
        mel: shape (80, T).
        fps: video frame rate.
        n_frames: number of windows to produce (see `frame_count`).

    Returns:
        Shape (n_frames, 80, 16), float32.
    """
    total = mel.shape[1]
    if total < MEL_STEP_SIZE:
        mel = np.pad(mel, ((0, 0), (0, MEL_STEP_SIZE - total)), constant_values=SILENCE_LEVEL)
        total = MEL_STEP_SIZE
    multiplier = MEL_FPS / fps
    starts = [min(int(i * multiplier), total - MEL_STEP_SIZE) for i in range(n_frames)]
    out = np.empty((n_frames, mel.shape[0], MEL_STEP_SIZE), dtype=np.float32)
    for i, start in enumerate(starts):
        out[i] = mel[:, start : start + MEL_STEP_SIZE]
    return out


class MelExtractor:
    """Signal -> per-frame model inputs; what the gRPC servicer calls.

    Args:
        sample_rate: rate of the signals passed to `run`; Wav2Lip's mel is defined at 16 kHz only.
    """

    def __init__(self, sample_rate: int = SAMPLE_RATE) -> None:
        if sample_rate != SAMPLE_RATE:
            raise ValueError(f"the Wav2Lip mel needs {SAMPLE_RATE} Hz audio, got {sample_rate}")
        self.sample_rate = sample_rate

    def run(self, signal: np.ndarray, fps: float) -> np.ndarray:
        """Mel windows for every output frame of `signal`.

        Args:
            signal: mono 16 kHz samples, shape (num_samples,).
            fps: output video frame rate.

        Returns:
            Shape (frame_count(num_samples, 16000, fps), 80, 16), float32.
        """
        mel = melspectrogram(signal)
        return mel_windows(mel, fps, frame_count(len(signal), self.sample_rate, fps))
