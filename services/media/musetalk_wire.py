"""The musetalk tier's wire formats (protos/lipline/v1/lipsync.proto, MuseTalkService): shapes, and
packing and checked unpacking of its latents, audio windows and items.

The lipsync-musetalk stage unpacks (every size, range and value checked at the edge, so a bad
message is INVALID_ARGUMENT naming what is wrong, never a reshape error in a shared batch); the
gateway and the workers pack. numpy only: the gateway, render and live images carry no torch.

- latents: float16 little-endian [8, 32, 32] per frame (16,384 bytes): the VAE latents (x 0.18215) of
  the masked crop, then of the whole crop, as upstream concatenates them for the UNet;
- masks: uint8 256 x 256 per frame (65,536 bytes) over the frame's mask box;
- audio windows: whisper's 80 log-mel bands x up to 3000 columns, float16 little-endian band-major,
  the columns not sent being the window's pad value; the encoder gives 1500 positions per window;
- items: (frame, latent, window, offset), the item's 10 encoder positions being offset .. offset + 9
  of its window (services/media/whisper_windows.py has upstream's rule for a clip's frames).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from lipline.v1 import lipsync_pb2
from services.media.whisper_windows import clip_positions, window_positions
from services.serving.errors import InvalidMedia

FACE_SIZE = 256  # the generated faces and the crops the latents encode: 256 x 256
LATENT_SHAPE = (8, 32, 32)
LATENT_BYTES = int(np.prod(LATENT_SHAPE)) * 2  # float16
MASK_SHAPE = (256, 256)
MASK_BYTES = MASK_SHAPE[0] * MASK_SHAPE[1]
LOG_MEL_BANDS = 80
WINDOW_COLUMNS = 3000  # 30 s of whisper's log-mel (100 columns per second)
WINDOW_POSITIONS = 1500  # the encoder's positions per window (50 per second)
ITEM_POSITIONS = 10  # encoder positions per generated frame (x 5 hidden states = 50 tokens)
MAX_OFFSET = 2 * WINDOW_POSITIONS  # |offset| beyond this cannot reach a window or its neighbours


def pack_latents(indices: Sequence[int], latents: np.ndarray) -> lipsync_pb2.LatentBank:
    """(N, 8, 32, 32) latents (any float) -> a LatentBank of these indices."""
    latents = np.asarray(latents)
    if latents.shape[1:] != LATENT_SHAPE or len(latents) != len(indices):
        raise ValueError(f"expected {len(indices)} latents of {LATENT_SHAPE}, got {latents.shape}")
    return lipsync_pb2.LatentBank(latent_indices=list(indices), latents=latents.astype("<f2").tobytes())


def unpack_latents(bank: lipsync_pb2.LatentBank) -> tuple[np.ndarray, np.ndarray]:
    """A LatentBank -> (indices (N,) int64, latents (N, 8, 32, 32) float16); InvalidMedia naming the problem."""
    indices = np.asarray(bank.latent_indices, dtype=np.int64)
    raw = bank.latents  # a bytes field is copied on each read: once
    if len(raw) != len(indices) * LATENT_BYTES:
        raise InvalidMedia(
            f"latents: {len(indices)} indices need {len(indices) * LATENT_BYTES} bytes "
            f"({'x'.join(map(str, LATENT_SHAPE))} float16 each), got {len(raw)}"
        )
    latents = np.frombuffer(raw, dtype="<f2").reshape(len(indices), *LATENT_SHAPE)
    finite = np.isfinite(latents).reshape(len(indices), -1).all(axis=1)
    if not finite.all():
        raise InvalidMedia(f"latents: latent {int(indices[int(np.argmin(finite))])} holds NaN or infinity")
    return indices, latents


@dataclasses.dataclass(frozen=True)
class Window:
    """An AudioWindow, unpacked and checked."""

    index: int
    log_mel: np.ndarray  # (80, columns) float16
    pad_value: float
    positions: int  # 1..1500: positions carrying audio
    continues: bool  # follows window index - 1 without a gap

    def full_columns(self) -> np.ndarray:
        """(80, 3000) float32: the columns sent, then the pad value."""
        out = np.full((LOG_MEL_BANDS, WINDOW_COLUMNS), self.pad_value, np.float32)
        out[:, : self.log_mel.shape[1]] = self.log_mel
        return out


def pack_window(
    index: int, log_mel: np.ndarray, pad_value: float, positions: int = WINDOW_POSITIONS, continues: bool = False
) -> lipsync_pb2.AudioWindow:
    """(80, columns) log-mel (columns <= 3000; the rest are `pad_value`) -> an AudioWindow."""
    log_mel = np.asarray(log_mel)
    if log_mel.ndim != 2 or log_mel.shape[0] != LOG_MEL_BANDS or not 0 < log_mel.shape[1] <= WINDOW_COLUMNS:
        raise ValueError(f"expected (80, 1..3000) log-mel, got {log_mel.shape}")
    return lipsync_pb2.AudioWindow(
        window_index=index,
        columns=log_mel.shape[1],
        pad_value=float(pad_value),
        log_mel=np.ascontiguousarray(log_mel.astype("<f2")).tobytes(),
        positions=positions,
        continues=continues,
    )


def clip_windows(log_mel: np.ndarray, samples: int) -> list[lipsync_pb2.AudioWindow]:
    """A clip's whisper log-mel ((W, 80, 3000), `whisper_log_mel_segments` of its `samples` 16 kHz
    samples) as the AudioWindows a job's Generate streams send: window k is index k, continues k - 1,
    carries `window_positions` of the clip's floor(seconds x 50) positions, and leaves out its trailing
    columns that all hold one value (the extractor's zero padding past the clip's end, clamped) as its
    pad value: what the stage fills back is what would have been sent, to the bit."""
    positions = clip_positions(samples)
    out = []
    for k, window in enumerate(np.asarray(log_mel)):
        half = window.astype("<f2")
        pad = half[0, -1]
        constant = (half == pad).all(axis=0)  # columns holding the pad value in every band
        columns = WINDOW_COLUMNS - int(np.argmin(constant[::-1])) if not constant.all() else 1
        out.append(pack_window(k, half[:, :columns], float(pad), window_positions(k, positions), continues=k > 0))
    return out


def unpack_window(msg: lipsync_pb2.AudioWindow) -> Window:
    """An AudioWindow -> Window; InvalidMedia naming the field out of its range."""
    what = f"audio window {msg.window_index}"
    if not 0 < msg.columns <= WINDOW_COLUMNS:
        raise InvalidMedia(f"{what}: columns is {msg.columns}; it must be in 1..{WINDOW_COLUMNS}")
    if not 0 < msg.positions <= WINDOW_POSITIONS:
        raise InvalidMedia(f"{what}: positions is {msg.positions}; it must be in 1..{WINDOW_POSITIONS}")
    if not np.isfinite(msg.pad_value):
        raise InvalidMedia(f"{what}: pad_value is not a finite number")
    raw = msg.log_mel
    expected = LOG_MEL_BANDS * msg.columns * 2
    if len(raw) != expected:
        raise InvalidMedia(
            f"{what}: {msg.columns} columns need {expected} bytes (80 x columns float16), got {len(raw)}"
        )
    log_mel = np.frombuffer(raw, dtype="<f2").reshape(LOG_MEL_BANDS, msg.columns)
    if not np.isfinite(log_mel).all():
        raise InvalidMedia(f"{what}: the log-mel holds NaN or infinity")
    return Window(int(msg.window_index), log_mel, float(msg.pad_value), int(msg.positions), bool(msg.continues))


def pack_items(
    frames: Sequence[int], latents: Sequence[int], windows: Sequence[int], offsets: Sequence[int]
) -> lipsync_pb2.MuseTalkItems:
    return lipsync_pb2.MuseTalkItems(
        frame_indices=list(frames), latent_indices=list(latents), window_indices=list(windows), offsets=list(offsets)
    )


def unpack_items(items: lipsync_pb2.MuseTalkItems) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MuseTalkItems -> (frames, latents, windows, offsets), each (N,) int64; InvalidMedia when the
    arrays differ in length or an offset is out of range."""
    frames = np.asarray(items.frame_indices, dtype=np.int64)
    latents = np.asarray(items.latent_indices, dtype=np.int64)
    windows = np.asarray(items.window_indices, dtype=np.int64)
    offsets = np.asarray(items.offsets, dtype=np.int64)
    n = len(frames)
    if not len(latents) == len(windows) == len(offsets) == n:
        raise InvalidMedia(
            f"items: {n} frame indices, {len(latents)} latent indices, {len(windows)} window indices and "
            f"{len(offsets)} offsets; one of each per item"
        )
    bad = np.abs(offsets) > MAX_OFFSET
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidMedia(
            f"items: the offset of frame {int(frames[i])} is {int(offsets[i])}; it must be in -{MAX_OFFSET}..{MAX_OFFSET}"
        )
    return frames, latents, windows, offsets
