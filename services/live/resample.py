"""Resampling to 16 kHz chunk by chunk, with the numbers of scipy's whole-clip `resample_poly`.

Why this exists: a live session's speech arrives at 16, 24 or 48 kHz in chunks of 10-100 ms, and the
Wav2Lip mel is defined at 16 kHz only. Resampling each chunk on its own would ring at every chunk
edge; a stateful resampler whose output depends on how the audio was cut would make the streamed mel
differ from the whole-clip mel. `resample_poly` is a pure FIR filter (polyphase, a Kaiser-windowed
sinc, zeros outside the signal), so each output sample depends on a fixed span of input samples:
`StreamResampler` computes exactly those outputs whose span has arrived, whatever the chunking, and
`finish` computes the tail against the zeros past the end, as `resample_poly` does. The filter is
designed the way scipy designs it (checked against `resample_poly` itself by the tests). It looks
ahead `delay_samples` input samples (17 at 24 kHz, 33 at 48 kHz: 0.69 ms).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.signal import firwin

KAISER_BETA = 5.0  # resample_poly's default window, ("kaiser", 5.0)


class StreamResampler:
    """Float samples at ``rate_in`` in, the same signal at ``rate_out`` out, as they become exact.

    Output sample n (at ``rate_out``) equals ``resample_poly(whole, up, down)[n]`` for the whole input,
    up to the order of a 61-term sum (~1e-16). `push` returns the outputs whose inputs have all
    arrived; `finish` returns the rest, up to ``ceil(n_in * up / down)`` samples in all.
    """

    def __init__(self, rate_in: int, rate_out: int = 16000) -> None:
        if rate_in <= 0 or rate_out <= 0:
            raise ValueError(f"sample rates must be positive, got {rate_in} -> {rate_out}")
        g = math.gcd(rate_in, rate_out)
        self.up, self.down = rate_out // g, rate_in // g
        self._n_in = 0  # input samples pushed
        self._n_out = 0  # output samples returned
        self._finished = False
        if self.up == self.down == 1:
            self._phases = np.ones((1, 1))
            self._pre_remove = 0
            return
        # scipy's design (resample_poly): a (2 * half_len + 1)-tap low-pass at the lower Nyquist, gain
        # `up`, zero-padded in front so output n lands on the filter's centre after dropping n_pre_remove.
        max_rate = max(self.up, self.down)
        half_len = 10 * max_rate
        taps = firwin(2 * half_len + 1, 1.0 / max_rate, window=("kaiser", KAISER_BETA)) * self.up
        n_pre_pad = self.down - half_len % self.down
        taps = np.concatenate((np.zeros(n_pre_pad), taps))
        self._pre_remove = (half_len + n_pre_pad) // self.down
        per_phase = -(-len(taps) // self.up)
        taps = np.concatenate((taps, np.zeros(per_phase * self.up - len(taps))))
        # phases[p, j] multiplies input sample q - j of an output whose up-sampled index has phase p.
        self._phases = taps.reshape(per_phase, self.up).T.copy()
        per_phase = self._phases.shape[1]
        # Input kept from global index _offset; zeros stand for the samples before the signal starts.
        self._buffer = np.zeros(per_phase - 1)
        self._offset = -(per_phase - 1)

    @property
    def delay_samples(self) -> int:
        """Input samples past an output sample's time that it needs (its filter's look-ahead), rounded up."""
        return -(-self._pre_remove * self.down // self.up)

    def push(self, samples: np.ndarray) -> np.ndarray:
        """Appends input samples; returns the output samples that are now exact (float64, maybe empty)."""
        if self._finished:
            raise RuntimeError("push after finish")
        samples = np.asarray(samples, dtype=np.float64)
        self._n_in += len(samples)
        if self.up == self.down == 1:
            self._n_out += len(samples)
            return samples.copy()
        self._buffer = np.concatenate((self._buffer, samples))
        # Output n needs input up to floor((n + pre) * down / up), i.e. (n + pre) * down < n_in * up.
        ready = -(-self._n_in * self.up // self.down) - self._pre_remove
        return self._compute(ready)

    def finish(self) -> np.ndarray:
        """The remaining output, with zeros past the end of the input (resample_poly's padding)."""
        if self._finished:
            raise RuntimeError("finish called twice")
        self._finished = True
        total = -(-self._n_in * self.up // self.down)
        if self.up == self.down == 1:
            return np.zeros(0)
        last_needed = ((total - 1 + self._pre_remove) * self.down) // self.up
        missing = last_needed + 1 - (self._offset + len(self._buffer))
        if missing > 0:
            self._buffer = np.concatenate((self._buffer, np.zeros(missing)))
        return self._compute(total)

    def _compute(self, stop: int) -> np.ndarray:
        """Outputs [_n_out, stop); then drops the input no later output needs."""
        start = self._n_out
        if stop <= start:
            return np.zeros(0)
        n = np.arange(start, stop)
        base = (n + self._pre_remove) * self.down  # index in the up-sampled signal
        phase = base % self.up
        newest = base // self.up - self._offset  # buffer index of input sample q (j = 0)
        per_phase = self._phases.shape[1]
        gathered = self._buffer[newest[:, None] - np.arange(per_phase)[None, :]]
        out = np.einsum("nj,nj->n", gathered, self._phases[phase])
        self._n_out = stop
        keep_from = ((stop + self._pre_remove) * self.down) // self.up - (per_phase - 1)
        drop = keep_from - self._offset
        if drop > 0:
            self._buffer = self._buffer[drop:]
            self._offset = keep_from
        return out
