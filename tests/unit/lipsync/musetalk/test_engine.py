"""The musetalk engine's audio gather against upstream's rule: a clip's windows, resolved per item
(services.media.whisper_windows, StreamWindows) and gathered on the device (MuseTalkEngine), give every
frame exactly the tokens upstream MuseTalk's `get_whisper_chunk` gives it (re-implemented here from its
description: concatenate, cut to floor(s x 50), pad 2 x ceil(50 / fps) left and 6 x ceil(50 / fps)
right, frame i takes padded positions floor(i x 50 / fps) .. + 10, rearranged time-major)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from services.inference.backends import make_backend
from services.lipsync.musetalk.engine import AudioWindowState, LatentBank, MuseTalkEngine, StreamWindows
from services.lipsync.musetalk.standin import StandInGenerator, StandInWhisperEncoder
from services.media.musetalk_wire import Window
from services.media.whisper_windows import clip_positions, frame_window, window_count, window_positions
from services.serving.errors import InvalidRequest, TooLarge

RATE = 16000


def upstream_tokens(hidden: np.ndarray, samples: int, fps: float) -> np.ndarray:
    """Upstream's frames' tokens [num_frames, 50, 384] from the clip's concatenated hidden states [T, 5, 384]."""
    fps = int(fps)
    multiplier = 50 / fps
    num_frames = math.floor(samples / RATE * fps)
    actual = math.floor(samples / RATE * 50)
    features = hidden[:actual]
    pad = math.ceil(multiplier)
    zeros = np.zeros((1, *hidden.shape[1:]), hidden.dtype)
    padded = np.concatenate([np.repeat(zeros, pad * 2, 0), features, np.repeat(zeros, pad * 3 * 2, 0)])
    out = [padded[math.floor(i * multiplier) : math.floor(i * multiplier) + 10] for i in range(num_frames)]
    return np.stack(out).reshape(num_frames, 50, hidden.shape[2])


def engine() -> MuseTalkEngine:
    cpu = torch.device("cpu")
    return MuseTalkEngine(
        make_backend("cpu", StandInWhisperEncoder(), cpu), make_backend("cpu", StandInGenerator(), cpu)
    )


def windows_of(hidden: np.ndarray, positions: int) -> StreamWindows:
    """A job's windows (30 s each, each continuing the one before) with their hidden states already encoded."""
    stream = StreamWindows(100_000)
    for k in range(window_count(positions)):
        valid = window_positions(k, positions)
        stream.add(Window(k, np.zeros((80, 1), np.float16), 0.0, valid, k > 0))
        state: AudioWindowState = stream._windows[k]
        state.hidden = torch.from_numpy(hidden[k * 1500 : k * 1500 + valid].copy())
        state.window = None
    return stream


@pytest.mark.parametrize(("seconds", "fps"), [(41.3, 25.0), (31.0, 30.0), (3.0, 25.0), (61.0, 24.0)])
def test_every_frame_gets_upstreams_tokens(seconds: float, fps: float) -> None:
    samples = int(seconds * RATE)
    positions = clip_positions(samples)
    hidden = np.random.default_rng(1).normal(size=(window_count(positions) * 1500, 5, 384)).astype(np.float32)
    expected = upstream_tokens(hidden, samples, fps)
    frames = np.arange(len(expected))
    wins, offs = zip(*(frame_window(int(i), fps) for i in frames))
    stream = windows_of(hidden, positions)
    groups = stream.resolve(frames, np.array(wins), np.array(offs))
    chunk = type("Chunk", (), {"audio": groups, "__len__": lambda self: len(frames)})()
    tokens = engine()._tokens([chunk], len(frames)).numpy()  # type: ignore[list-item]
    np.testing.assert_array_equal(tokens, expected)


def test_a_window_without_continues_reads_zeros_past_its_ends_and_replacing_affects_later_items() -> None:
    stream = StreamWindows(1540)
    stream.add(Window(0, np.zeros((80, 4), np.float16), -1.5, 20, False))
    stream.add(Window(1, np.zeros((80, 4), np.float16), -1.5, 20, False))  # a live tick's window: no neighbours
    (group,) = stream.resolve(np.array([7]), np.array([1]), np.array([-4]))
    window, rows, positions = group
    assert window.index == 1 and rows.tolist() == list(range(4, 10)) and positions.tolist() == list(range(6))
    (late,) = stream.resolve(np.array([8]), np.array([1]), np.array([15]))
    assert late[1].tolist() == list(range(5)) and late[2].tolist() == list(range(15, 20))
    stream.add(Window(1, np.zeros((80, 4), np.float16), -1.5, 30, False))  # replaced: a new object for later items
    (again,) = stream.resolve(np.array([9]), np.array([1]), np.array([15]))
    assert again[0] is not window and again[1].tolist() == list(range(10))
    with pytest.raises(InvalidRequest, match="item for frame 3 names audio window 5, which this stream has not sent"):
        stream.resolve(np.array([1, 3]), np.array([0, 5]), np.array([0, 0]))
    with pytest.raises(TooLarge, match="would hold 1550 encoder positions, more than 1540"):
        stream.add(Window(2, np.zeros((80, 4), np.float16), -1.5, 1500, False))
    stream.add(Window(0, np.zeros((80, 4), np.float16), -1.5, 1500, False))  # replacing frees its positions


def test_the_latent_bank_uploads_once_replaces_by_index_and_names_what_is_missing() -> None:
    bank = LatentBank(torch.device("cpu"), max_latents=3)
    first = np.full((2, 8, 32, 32), 1.0, np.float16)
    bank.add(np.array([5, 7]), first)
    assert bank.rows(np.array([7, 5, 7]), np.arange(3)).tolist() == [1, 0, 1]
    assert float(bank.tensor()[1, 0, 0, 0]) == 1.0
    bank.add(np.array([7, 9]), np.stack([np.full((8, 32, 32), 2.0), np.full((8, 32, 32), 3.0)]).astype(np.float16))
    tensor = bank.tensor()
    assert len(bank) == 3 and [float(tensor[r, 0, 0, 0]) for r in range(3)] == [1.0, 2.0, 3.0]
    with pytest.raises(TooLarge, match="more than 3 latents"):
        bank.add(np.array([11]), first[:1])
    with pytest.raises(InvalidRequest, match="item for frame 4 names latent 8, which this stream has not sent"):
        bank.rows(np.array([5, 8]), np.array([3, 4]))
