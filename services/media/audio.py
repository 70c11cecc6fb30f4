"""Decode uploaded audio bytes (any container FFmpeg knows) into the mono 16 kHz float signal the mel
pipeline expects.

Why PyAV and not librosa.load: requests carry bytes, not files, and PyAV decodes WAV, MP3, FLAC, OGG
and M4A/AAC from memory with the FFmpeg it bundles, so there is no temp file and no ffmpeg binary to
shell out to (Wav2Lip converts non-WAV input with `ffmpeg` to temp/temp.wav first).

Every failure becomes an `InvalidMedia`/`TooLarge` whose message tells the caller what to send instead.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator

import av
import numpy as np

from services.media import av_limits  # noqa: F401 - caps FFmpeg allocations on import
from services.serving.errors import InvalidMedia, TooLarge

_FORMATS_HINT = "send WAV, MP3, FLAC, OGG or M4A"
# More channels than any speech recording has (7.1.4 is 12, Ambisonics 3rd order 16, a 22.2 mix 24).
# WAV allows 65,535; every channel costs a decode and resample pass, so refuse from the header.
MAX_CHANNELS = 32
# Sample rates a file may declare. Below 4 kHz nothing intelligible is left of speech, and the
# resampler's output grows with target/source: a 1 MB WAV declaring 1 Hz is 500,000 s of audio, each
# of its packets becomes millions of samples (118 MB at once, measured), and where no max_seconds
# applies (a render worker's AAC track at 48 kHz) it would ask for 96 GB. Above 768 kHz (the highest
# rate converters offer) there is no speech either; a header declaring 2**31-1 Hz made the resampler
# fail with ENOMEM. Both are checked from the header, before decoding.
MIN_SAMPLE_RATE = 4_000
MAX_SAMPLE_RATE = 768_000


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
        InvalidMedia: empty, undecodable, no audio stream, more than `MAX_CHANNELS` channels, a
            sample rate outside [`MIN_SAMPLE_RATE`, `MAX_SAMPLE_RATE`], or no samples decoded.
        TooLarge: longer than `max_seconds`.
    """
    limit = None if max_seconds is None else int(max_seconds * sample_rate)
    pieces: list[np.ndarray] = []
    total = 0
    resampler: av.AudioResampler | None = None
    with _open(data) as (container, stream):
        try:
            for frame in _decoded(container, stream):
                if resampler is None:
                    # Packed float at the target rate, source channel layout kept (we average below).
                    resampler = av.AudioResampler(format="flt", layout=frame.layout, rate=sample_rate)
                for out in resampler.resample(frame):
                    pieces.append(_mono(out))
                    total += out.samples
                if limit is not None and max_seconds is not None and total > limit:
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
    if limit is not None and max_seconds is not None and total > limit:  # the flush can push a clip just over the limit
        raise TooLarge(_too_long_message(None, max_seconds, total / sample_rate))
    signal = np.concatenate(pieces).astype(np.float32, copy=False)
    # Float sources and resampler ringing can overshoot slightly; the contract is [-1, 1].
    return np.clip(signal, -1.0, 1.0)


@contextlib.contextmanager
def _open(data: bytes) -> Iterator[tuple[av.container.InputContainer, av.audio.stream.AudioStream]]:
    """The container and its first audio stream, checked (channels, a decoder, the rate if known)."""
    if not data:
        raise InvalidMedia("audio is empty")
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise InvalidMedia(f"could not decode audio: {_reason(exc)}; {_FORMATS_HINT}") from exc
    with container:
        if not container.streams.audio:
            raise InvalidMedia(f"the file has no audio stream; {_FORMATS_HINT}")
        stream = container.streams.audio[0]
        if stream.codec_context is None:  # FFmpeg knows the container but has no decoder for the codec
            raise InvalidMedia(f"the audio's codec is not one this service can decode; {_FORMATS_HINT}")
        channels = stream.codec_context.channels
        if channels > MAX_CHANNELS:
            raise InvalidMedia(
                f"audio has {channels} channels; the limit is {MAX_CHANNELS}: send mono or stereo speech"
            )
        if stream.codec_context.sample_rate:  # 0 where only decoding tells: then checked on the first frame
            _check_rate(stream.codec_context.sample_rate)
        yield container, stream


def _decoded(container: av.container.InputContainer, stream: av.audio.stream.AudioStream) -> Iterator[av.AudioFrame]:
    """The stream's frames; the first one's rate checked (some formats tell it only there)."""
    first = True
    for frame in container.decode(stream):
        if first:
            _check_rate(frame.sample_rate)
            first = False
        yield frame


def _check_rate(rate: int) -> None:
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise InvalidMedia(
            f"audio sample rate is {rate} Hz; it must be between {MIN_SAMPLE_RATE} and {MAX_SAMPLE_RATE} Hz: send speech sampled at 8 to 48 kHz"
        )


def _mono(frame: av.AudioFrame) -> np.ndarray:
    """The mean over channels of a packed float frame: (1, samples * channels) -> (samples,)."""
    channels = len(frame.layout.channels)
    return frame.to_ndarray().reshape(-1, channels).mean(axis=1)


def _too_long_message(
    container: av.container.InputContainer | None, max_seconds: float, seconds: float | None = None
) -> str:
    """'audio is N s long; the limit is M s', with N from the header when decoding stopped early."""
    if seconds is None and container is not None and container.duration:
        seconds = container.duration / av.time_base
    if seconds is None or seconds <= max_seconds:  # header missing or wrong: say what we know
        return f"audio is longer than {max_seconds:g} s; the limit is {max_seconds:g} s"
    return f"audio is {seconds:.1f} s long; the limit is {max_seconds:g} s"
