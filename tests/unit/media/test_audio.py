"""services.media.audio on audio synthesised in memory with PyAV."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from services.media.audio import MAX_CHANNELS, decode_audio
from services.serving.errors import InvalidMedia, TooLarge
from tests.helpers.audio_files import FORMATS, can_encode, encode_tone, multichannel_wav


def _dominant_frequency(signal: np.ndarray, sample_rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(signal * np.hanning(len(signal))))
    return float(np.argmax(spectrum)) * sample_rate / len(signal)


@pytest.mark.parametrize("fmt", ["wav", "mp3", "flac", "m4a", "ogg"])
def test_decode_formats(fmt):
    if not can_encode(fmt):
        pytest.skip(f"this PyAV build has no {FORMATS[fmt][1]} encoder")
    data = encode_tone(fmt, 1.5, rate=44100, channels=2)
    signal = decode_audio(data)
    assert signal.dtype == np.float32 and signal.ndim == 1
    assert abs(len(signal) - 24000) <= 0.02 * 24000
    assert np.abs(signal).max() <= 1.0
    assert _dominant_frequency(signal, 16000) == pytest.approx(440.0, abs=2.0)
    # Channels are averaged (a 0.5-amplitude tone on both channels stays ~0.5), not summed at 0.707.
    assert np.abs(signal).max() == pytest.approx(0.5, abs=0.05)


def test_decode_mono_and_other_rate():
    signal = decode_audio(encode_tone("wav", 1.0, rate=8000, channels=1, freq=300.0), sample_rate=22050)
    assert abs(len(signal) - 22050) <= 0.02 * 22050
    assert _dominant_frequency(signal, 22050) == pytest.approx(300.0, abs=2.0)


def test_empty_bytes():
    with pytest.raises(InvalidMedia, match="audio is empty"):
        decode_audio(b"")


def test_random_bytes():
    data = np.random.default_rng(0).bytes(5000)
    with pytest.raises(InvalidMedia, match="could not decode audio: .*send WAV, MP3, FLAC, OGG or M4A"):
        decode_audio(data)


def test_truncated_header():
    with pytest.raises(InvalidMedia, match="WAV, MP3, FLAC, OGG or M4A") as info:
        decode_audio(encode_tone("wav", 1.0)[:30])
    assert "Errno" not in str(info.value)


def test_no_audio_stream():
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="matroska") as out:
        stream = out.add_stream("mjpeg", rate=25)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuvj420p"
        frame = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), dtype=np.uint8), format="rgb24")
        out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    with pytest.raises(InvalidMedia, match="no audio stream"):
        decode_audio(buf.getvalue())


def test_max_seconds():
    data = encode_tone("wav", 1.5)
    with pytest.raises(TooLarge, match=r"audio is 1.5 s long; the limit is 1 s"):
        decode_audio(data, max_seconds=1.0)
    assert len(decode_audio(data, max_seconds=2.0)) == 24000


@pytest.mark.parametrize("channels", [3, 7, 8, 9, 16, 32])
def test_any_channel_count_up_to_the_limit_is_averaged(channels: int) -> None:
    # 8 and 16 channels used to kill the process (PyAV read planar planes past AVFrame.data[8]).
    signal = decode_audio(multichannel_wav(1.0, channels))
    assert abs(len(signal) - 16000) <= 160
    assert np.abs(signal).max() == pytest.approx(0.5, abs=0.02)
    assert _dominant_frequency(signal, 16000) == pytest.approx(440.0, abs=2.0)


def test_more_channels_than_the_limit_is_refused_from_the_header() -> None:
    with pytest.raises(InvalidMedia, match=f"{MAX_CHANNELS + 1} channels; the limit is {MAX_CHANNELS}"):
        decode_audio(multichannel_wav(0.2, MAX_CHANNELS + 1))


def _no_audio_stream() -> bytes:
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="matroska") as out:
        stream = out.add_stream("mjpeg", rate=25)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuvj420p"
        out.mux(stream.encode(av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), dtype=np.uint8), format="rgb24")))
        out.mux(stream.encode(None))
    return buf.getvalue()


@pytest.mark.parametrize(
    "data, limit, error",
    [
        (b"", None, InvalidMedia),
        (np.random.default_rng(0).bytes(5000), None, InvalidMedia),
        (encode_tone("wav", 1.0)[:30], None, InvalidMedia),
        (_no_audio_stream(), None, InvalidMedia),
        (multichannel_wav(0.2, MAX_CHANNELS + 1), None, InvalidMedia),
        (encode_tone("wav", 1.5), 1.0, TooLarge),
    ],
    ids=["empty", "random", "truncated", "no-audio-stream", "too-many-channels", "too-long"],
)
def test_bad_uploads_are_refused_with_lipline_errors(data: bytes, limit: float | None, error: type) -> None:
    with pytest.raises(error):
        decode_audio(data, 16000, limit)


def test_a_clip_of_exactly_the_limit_passes() -> None:
    # The gateway's max_audio_seconds reaches the audio stage as ExtractOptions.max_seconds.
    data = encode_tone("wav", 1.5, rate=16000, channels=1)
    assert len(decode_audio(data, 16000, max_seconds=1.5)) == 24000
    with pytest.raises(TooLarge):
        decode_audio(data, 16000, max_seconds=1.49)
