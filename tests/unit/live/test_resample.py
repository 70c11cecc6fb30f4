"""StreamResampler: chunk by chunk, the numbers of scipy's whole-clip resample_poly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.signal import resample_poly

from services.live.resample import StreamResampler


def _streamed(resampler: StreamResampler, signal: np.ndarray, sizes: list[int]) -> np.ndarray:
    out, i, k = [], 0, 0
    while i < len(signal):
        n = sizes[k % len(sizes)]
        out.append(resampler.push(signal[i : i + n]))
        i, k = i + n, k + 1
    out.append(resampler.finish())
    return np.concatenate(out)


@settings(max_examples=40, deadline=None, database=None)
@given(
    rate=st.sampled_from([16000, 24000, 48000, 22050, 44100, 8000]),
    length=st.integers(1, 6000),
    sizes=st.lists(st.integers(1, 1500), min_size=1, max_size=20),
    seed=st.integers(0, 2**16),
)
def test_streamed_equals_whole_clip_resample_poly(rate: int, length: int, sizes: list[int], seed: int) -> None:
    signal = np.random.default_rng(seed).uniform(-1, 1, length)
    g = math.gcd(rate, 16000)
    expected = resample_poly(signal, 16000 // g, rate // g)
    got = _streamed(StreamResampler(rate), signal, sizes)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("rate", "delay"), [(16000, 0), (24000, 17), (48000, 33)])
def test_an_output_sample_comes_out_once_its_look_ahead_has_arrived(rate: int, delay: int) -> None:
    """Output n (at input position n * rate / 16 kHz) needs input up to `delay_samples` past that position, and no more."""
    resampler = StreamResampler(rate)
    assert resampler.delay_samples == delay
    signal = np.random.default_rng(0).uniform(-1, 1, 3 * rate // 100)
    first_seen = []  # input samples pushed when each output sample first came out
    for i in range(len(signal)):
        first_seen += [i + 1] * len(resampler.push(signal[i : i + 1]))
    assert len(first_seen) > 0
    # input samples past each output's own position that it waited for: never more than the delay, the bound tight
    waited = [pushed - 1 - n * rate / 16000 for n, pushed in enumerate(first_seen)]
    assert max(waited) <= delay and max(waited) > delay - 1
    assert len(first_seen) + len(resampler.finish()) == math.ceil(len(signal) * 16000 / rate)
