from __future__ import annotations

import numpy as np
import pytest

from services.jobs.segment_audio import pack_segment_audio, unpack_segment_audio
from services.media.wire import MEL_BYTES


def test_round_trip() -> None:
    rng = np.random.default_rng(0)
    mels = rng.uniform(-4, 4, (7, 80, 16)).astype("<f2")
    speech = np.linspace(0, 1, 7, dtype=np.float32)
    blob = pack_segment_audio(mels.view(np.uint8).reshape(7, MEL_BYTES), speech)
    audio = unpack_segment_audio(blob, 7)
    assert len(audio) == 7
    np.testing.assert_array_equal(audio.mels, mels)
    np.testing.assert_allclose(audio.speech, speech, atol=1e-3)


def test_a_blob_of_windows_only_has_no_envelope() -> None:
    mels = np.zeros((3, 80, 16), "<f2")
    audio = unpack_segment_audio(mels.tobytes(), 3)
    assert audio.speech is None and audio.mels.shape == (3, 80, 16)


def test_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="3 frames need"):
        unpack_segment_audio(b"\0" * (3 * MEL_BYTES + 1), 3)
    with pytest.raises(ValueError, match="2 windows but 3"):
        pack_segment_audio(np.zeros((2, MEL_BYTES), np.uint8), np.zeros(3))


def test_a_musetalk_jobs_blob_is_the_envelope_alone() -> None:
    speech = np.array([0.0, 0.25, 1.0], np.float32)
    blob = pack_segment_audio(None, speech)
    assert len(blob) == 6
    audio = unpack_segment_audio(blob, 3)
    assert audio.mels is None and audio.speech is not None and audio.speech.tolist() == [0.0, 0.25, 1.0]
    with pytest.raises(ValueError):
        unpack_segment_audio(blob, 4)
