"""services.live.whisper_stream: the musetalk tier's live whisper features against the job's (upstream's
feature extractor, services/media/whisper_mel.py) on real speech."""

from __future__ import annotations

import numpy as np
import pytest

from services.live.whisper_stream import WhisperStream, frame_samples, lookahead_ms
from services.media.audio import decode_audio
from services.media.musetalk_wire import pack_window, unpack_window
from services.media.whisper_mel import whisper_log_mel, whisper_log_mel_segments
from services.media.whisper_windows import first_position
from tests.integration.util import SAMPLES


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return decode_audio((SAMPLES / "speech.wav").read_bytes(), 16000)  # 7.7 s


def streamed(samples: np.ndarray, chunk: int, **kwargs: float) -> WhisperStream:
    stream = WhisperStream(16000, 25.0, **kwargs)
    for k in range(0, len(samples), chunk):
        stream.push(samples[k : k + chunk].astype(np.float64))
    return stream


def test_an_ended_utterance_gives_the_jobs_window(speech: np.ndarray) -> None:
    """With the whole utterance heard, a window is the job's 30 s window of it, to the float16 the wire carries."""
    stream = streamed(speech, 480)
    stream.finish()
    window = stream.frame_window([0, 90, 190])  # frame 190's cut reaches past the end
    assert window.offsets == (-4, 176, 376)  # upstream's first positions: the window starts with the utterance
    assert window.positions == len(speech) * 50 // 16000 == 384  # the clip's, as a job's last window
    full = unpack_window(pack_window(0, window.log_mel, window.pad_value, window.positions)).full_columns()
    expected = whisper_log_mel(speech).astype(np.float16).astype(np.float32)
    columns = window.log_mel.shape[1]
    assert np.array_equal(full[:, :columns], expected[:, :columns])
    assert np.allclose(full[:, columns:], expected[:, columns:], atol=1e-3)  # the pad value (float16 in the job's)


def test_a_frame_is_ready_at_its_cut_and_its_window_does_not_depend_on_the_chunks(speech: np.ndarray) -> None:
    assert lookahead_ms() == 212.5 and lookahead_ms(0.0) == 132.5
    frame = 50
    cut = frame_samples(frame, 25.0) + 1280
    assert cut == 640 * frame + 2120 + 1280
    stream = WhisperStream(16000, 25.0)
    stream.push(speech[: cut - 1].astype(np.float64))
    assert not stream.ready(frame)
    stream.push(speech[cut - 1 : cut + 5000].astype(np.float64))  # more audio than the frame's window holds
    assert stream.ready(frame)
    a = stream.frame_window([frame])
    b = streamed(speech[: cut + 20_000], 160).frame_window([frame])
    assert a.offsets == b.offsets == (first_position(frame, 25.0),)
    assert np.array_equal(a.log_mel, b.log_mel) and a.pad_value == b.pad_value
    assert a.log_mel.shape[1] == (cut - 200) // 160 + 1  # the columns whose whole FFT window it holds


def test_mid_stream_windows_differ_from_the_jobs_only_by_their_cut_and_maximum(speech: np.ndarray) -> None:
    offline = whisper_log_mel(speech)
    stream = WhisperStream(16000, 25.0)
    heard = 0
    for frame in range(0, 180, 7):
        while not stream.ready(frame):
            stream.push(speech[heard : heard + 320].astype(np.float64))
            heard += 320
        window = stream.frame_window([frame])
        columns = window.log_mel.shape[1]
        # the columns it holds are the job's, up to where the 80 dB floor hangs from (its own maximum)
        job = offline[:, :columns]
        above = (window.log_mel > window.pad_value + 1e-6) & (job > offline.min() + 1e-6)
        assert np.allclose(window.log_mel[above], job[above], atol=1e-5)
        assert above.mean() > 0.5


def test_a_long_utterance_takes_the_jobs_next_window_and_keeps_only_its_columns(speech: np.ndarray) -> None:
    """Past 30 s the frame's window is the job's second one (its absolute positions are the job's)."""
    long = np.concatenate([speech] * 5)  # 38.5 s: two job windows
    stream = WhisperStream(16000, 25.0)
    heard = 0
    job = whisper_log_mel_segments(long)
    for frame in (10, 700, 745, 749, 752, 756, 760, 800):  # as a session asks, once its audio is there
        while not stream.ready(frame):
            stream.push(long[heard : heard + 320].astype(np.float64))
            heard += 320
        window = stream.frame_window([frame])
        position = first_position(frame, 25.0)
        assert window.offsets == (position % 1500,)  # window 0 up to frame 751, then window 1
    assert heard < 16000 * 33  # the frames were made as the audio came, not at its end
    assert window.offsets == (96,)
    live, expected = window.log_mel, job[1][:, : window.log_mel.shape[1]]
    above = (live > window.pad_value + 1e-6) & (expected > job[1].min() + 1e-6)  # both above their 80 dB floors
    assert live.shape[1] > 2 * 96 and above.mean() > 0.5
    assert np.allclose(live[above], expected[above], atol=1e-5)  # the first columns too: the job's reflection
    assert stream._columns.shape[1] <= 3000 + 100  # only the current window's columns are kept
    assert len(stream._signal) < 16000 * 31
