"""Decode uploaded audio bytes (any container FFmpeg knows) into the mono 16 kHz float signal the mel
pipeline expects.

Why PyAV and not librosa.load: requests carry bytes, not files, and PyAV decodes WAV, MP3, FLAC, OGG
and M4A/AAC from memory with the FFmpeg it bundles, so there is no temp file and no ffmpeg binary to
shell out to (Wav2Lip converts non-WAV input with `ffmpeg` to temp/temp.wav first).

Every failure becomes an `InvalidMedia`/`TooLarge` whose message tells the caller what to send instead.
"""

from __future__ import annotations

import io

import av
import numpy as np

from services.common.errors import InvalidMedia, TooLarge

_FORMATS_HINT = "send WAV, MP3, FLAC, OGG or M4A"
# More channels than any speech recording has (7.1.4 is 12, Ambisonics 3rd order 16, a 22.2 mix 24).
# WAV allows 65,535; every channel costs a decode and resample pass, so refuse from the header.
MAX_CHANNELS = 32


def _reason(exc: BaseException) -> str:
    """FFmpeg's own words for an error, without PyAV's '[Errno N] ...: <file>' decoration."""
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def decode_audio(data: bytes, sample_rate: int = 16000, max_seconds: float | None = None) -> np.ndarray:
    """Decode a complete audio file held in memory.

    Channels are averaged (what Wav2Lip's `librosa.load(..., sr=16000)` does). We deliberately do not
    let FFmpeg downmix with `layout="mono"`: its stereo->mono matrix is 0.707*(L+R) for float output,
    which is 3 dB louder than the mean (shifting every normalised mel value by ~0.24) and can exceed 1.

    The resampler's output is *packed* float (one interleaved plane), never planar: PyAV reads a
    planar frame's planes from AVFrame.data, which has 8 slots, so `to_ndarray()` of a planar frame
    with more than 8 channels reads past the array and kills the process (SIGSEGV) - one upload of
    an 8.1- or 16-channel WAV took the whole gateway down. A packed frame has one plane at any count.

    Args:
        data: the file's bytes (WAV, MP3, FLAC, OGG, M4A/AAC or anything else FFmpeg probes).
        sample_rate: output rate in Hz.
        max_seconds: if given, longer audio raises `TooLarge`; checked while decoding, so an
            oversized upload is rejected without decoding all of it.

    Returns:
        Mono samples, shape (num_samples,), float32, clipped to [-1, 1].

    Raises:
        InvalidMedia: empty, undecodable, no audio stream, or no samples decoded.
        TooLarge: longer than `max_seconds`.
    """
    if not data:
        raise InvalidMedia("audio is empty")
    limit = None if max_seconds is None else int(max_seconds * sample_rate)
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise InvalidMedia(f"could not decode audio: {_reason(exc)}; {_FORMATS_HINT}") from exc

    with container:
        if not container.streams.audio:
            raise InvalidMedia(f"the file has no audio stream; {_FORMATS_HINT}")
        stream = container.streams.audio[0]
        channels = stream.codec_context.channels
        if channels > MAX_CHANNELS:
            raise InvalidMedia(
                f"audio has {channels} channels; the limit is {MAX_CHANNELS}: send mono or stereo speech"
            )
        pieces: list[np.ndarray] = []
        total = 0
        resampler: av.AudioResampler | None = None
        try:
            for frame in container.decode(stream):
                if resampler is None:
                    # Packed float at the target rate, source channel layout kept (we average below).
                    resampler = av.AudioResampler(format="flt", layout=frame.layout, rate=sample_rate)
                for out in resampler.resample(frame):
                    pieces.append(_mono(out))
                    total += out.samples
                if limit is not None and total > limit:
                    raise TooLarge(_too_long_message(container, max_seconds))
            if resampler is not None:
                # The resampler holds back a few samples of filter delay; flushing returns them.
                for out in resampler.resample(None):
                    pieces.append(_mono(out))
                    total += out.samples
        except (av.FFmpegError, ValueError, OSError) as exc:
            raise InvalidMedia(f"could not decode audio: {_reason(exc)}; {_FORMATS_HINT}") from exc

    if total == 0:
        raise InvalidMedia(f"the audio decoded to zero samples (empty or truncated file); {_FORMATS_HINT}")
    if limit is not None and total > limit:  # the flush can push a clip just over the limit
        raise TooLarge(_too_long_message(None, max_seconds, total / sample_rate))
    signal = np.concatenate(pieces).astype(np.float32, copy=False)
    # Float sources and resampler ringing can overshoot slightly; the contract is [-1, 1].
    return np.clip(signal, -1.0, 1.0)


def _mono(frame: av.AudioFrame) -> np.ndarray:
    """The mean over channels of a packed float frame: (1, samples * channels) -> (samples,)."""
    channels = len(frame.layout.channels)
    return frame.to_ndarray().reshape(-1, channels).mean(axis=1)


def _too_long_message(container: av.container.InputContainer | None, max_seconds: float,
                      seconds: float | None = None) -> str:
    """'audio is N s long; the limit is M s', with N from the header when decoding stopped early."""
    if seconds is None and container is not None and container.duration:
        seconds = container.duration / av.time_base
    if seconds is None or seconds <= max_seconds:  # header missing or wrong: say what we know
        return f"audio is longer than {max_seconds:g} s; the limit is {max_seconds:g} s"
    return f"audio is {seconds:.1f} s long; the limit is {max_seconds:g} s"
