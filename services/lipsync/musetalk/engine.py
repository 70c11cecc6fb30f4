"""The lipsync-musetalk stage's batch engine: a stream's latents and audio windows live on the device,
each batch runs the whisper encoder (windows not encoded yet), the gather of every item's audio
tokens, and the generator (UNet + VAE decode) in one pass (docs/architecture.md section 12).

Per Generate stream:
- `LatentBank`: the avatar's latents [8, 32, 32] per frame, sent once, on the device in float16 (the
  Wav2Lip stage's CropBank, for latents);
- `StreamWindows`: its audio windows by index; each `AudioWindowState` holds the log-mel until the
  encoder has run over it (once, in the first batch that needs it), then only the hidden states of its
  positions that carry audio ([positions, 5, 384]). Replacing an index (a live tick) affects later
  messages only: a queued item keeps the window it was decoded against. The positions a stream holds
  are bounded (`max_window_positions`).

Per request message, a `MuseTalkChunk` (what the batcher queues): bank rows, and each item's 10
encoder positions resolved at decode time to (window, position) pairs, grouped by window; positions
no window covers read zeros (upstream's padding). `MuseTalkEngine.process` then, for the merged batch:
encodes the windows not encoded yet ([W, 80, 3000] in one encoder pass), gathers the tokens
[B, 10, 5, 384] -> [B, 50, 384] (time-major, as upstream's rearrange), runs the generator on
(latents, tokens), turns the RGB faces in [0, 1] into uint8 BGR 256 x 256 (x 255, rounded, as
upstream) and hands them to `DeviceBatchEngine`'s single copy back. All model work runs on the
compute stream under its lock, so hidden states made by one batch are ready for the next.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from services.inference.backends import Backend
from services.inference.bank import DeviceBank
from services.inference.engine import DeviceBatchEngine, Part
from services.media.musetalk_wire import FACE_SIZE, ITEM_POSITIONS, LATENT_SHAPE, Window
from services.serving.errors import InvalidRequest, TooLarge

__all__ = ["AudioWindowState", "LatentBank", "MuseTalkChunk", "MuseTalkEngine", "StreamWindows"]


class LatentBank(DeviceBank):
    """One stream's latents, uploaded once, as an (N, 8, 32, 32) float16 tensor on the device."""

    def __init__(self, device: torch.device, max_latents: int) -> None:
        super().__init__(device, LATENT_SHAPE, torch.float16, max_latents, "latent", "latents")

    def add(self, indices: np.ndarray, latents: np.ndarray) -> None:
        """Register latents (N, 8, 32, 32) float16 under `indices`; an index sent again is replaced."""
        self.put(indices.tolist(), latents)


class AudioWindowState:
    """One audio window of a stream: its log-mel until encoded, then the hidden states of its positions."""

    def __init__(self, window: Window) -> None:
        self.index = window.index
        self.positions = window.positions
        self.continues = window.continues
        self.window: Window | None = window  # dropped once encoded
        self.hidden: torch.Tensor | None = None  # [positions, 5, 384] on the device once encoded
        self.previous: AudioWindowState | None = None  # set while decoding items (the neighbours at that time)
        self.next: AudioWindowState | None = None


class StreamWindows:
    """A stream's audio windows by index, the positions they hold bounded by `max_positions`."""

    def __init__(self, max_positions: int) -> None:
        self.max_positions = max_positions
        self._windows: dict[int, AudioWindowState] = {}
        self._positions = 0

    def add(self, window: Window) -> None:
        old = self._windows.get(window.index)
        held = self._positions - (old.positions if old is not None else 0) + window.positions
        if held > self.max_positions:
            raise TooLarge(
                f"audio window {window.index}: the stream's windows would hold {held} encoder positions, more than "
                f"{self.max_positions} (the stage's max_window_positions): send a window again under an index in use to replace it"
            )
        self._windows[window.index] = AudioWindowState(window)
        self._positions = held

    def resolve(
        self, frame_indices: np.ndarray, window_indices: np.ndarray, offsets: np.ndarray
    ) -> list[tuple[AudioWindowState, np.ndarray, np.ndarray]]:
        """Each item's 10 positions as (window, rows, positions) groups: `rows` index the chunk's
        items x 10 (item i's position k is row 10 i + k), `positions` that window's positions.
        Positions no window covers are left out (they read zeros). InvalidRequest naming the first
        item whose window this stream has not sent."""
        n = len(window_indices)
        positions = offsets[:, None] + np.arange(ITEM_POSITIONS)[None, :]  # (n, 10)
        rows = np.arange(n * ITEM_POSITIONS).reshape(n, ITEM_POSITIONS)
        groups: dict[int, tuple[AudioWindowState, list[np.ndarray], list[np.ndarray]]] = {}

        def take(window: AudioWindowState, mask: np.ndarray, shift: int) -> None:
            if mask.any():
                group = groups.setdefault(id(window), (window, [], []))
                group[1].append(rows[mask])
                group[2].append(positions[mask] + shift)

        for index in np.unique(window_indices).tolist():
            window = self._windows.get(index)
            mine = window_indices == index
            if window is None:
                bad = int(np.argmax(mine))
                raise InvalidRequest(
                    f"item for frame {int(frame_indices[bad])} names audio window {index}, which this stream has not sent"
                )
            p = np.where(mine[:, None], positions, -(10**9))  # other items' positions: outside every window
            take(window, (p >= 0) & (p < window.positions), 0)
            previous = self._windows.get(index - 1) if window.continues else None
            if previous is not None:
                take(previous, mine[:, None] & (p < 0) & (p >= -previous.positions), previous.positions)
            following = self._windows.get(index + 1)
            if following is not None and following.continues:
                beyond = p - window.positions
                take(following, (beyond >= 0) & (beyond < following.positions), -window.positions)
        return [(w, np.concatenate(r), np.concatenate(c)) for w, r, c in groups.values()]


@dataclasses.dataclass
class MuseTalkChunk:
    """The items of one request message: what the batcher queues (never split across batches)."""

    bank: LatentBank
    rows: np.ndarray  # (n,) int64 rows of `bank`
    audio: list[tuple[AudioWindowState, np.ndarray, np.ndarray]]  # StreamWindows.resolve's groups

    def __len__(self) -> int:
        return len(self.rows)


class MuseTalkEngine(DeviceBatchEngine[MuseTalkChunk]):
    """Runs merged batches through the whisper encoder and generator backends, on their device."""

    def __init__(self, encoder: Backend, generator: Backend, overlap: bool = False) -> None:
        super().__init__(generator.device, overlap)
        self.encoder = encoder
        self.generator = generator

    def new_bank(self, max_latents: int) -> LatentBank:
        return LatentBank(self.device, max_latents)

    def _encode(self, chunks: list[MuseTalkChunk]) -> None:
        """Run the encoder over the batch's windows that have not been (on the compute stream)."""
        todo = list({id(w): w for c in chunks for w, _, _ in c.audio if w.hidden is None}.values())
        if not todo:
            return
        mels = np.stack([w.window.full_columns() for w in todo if w.window is not None])
        mel_t = torch.from_numpy(mels)
        if self._pin:
            mel_t = mel_t.pin_memory()
        hidden = self.encoder.forward_device(mel_t.to(self.device, non_blocking=True))
        for i, window in enumerate(todo):
            kept = hidden[i, : window.positions]
            # Keep only the window's own positions, not the whole batch's output (a view of an expanded
            # stand-in output costs nothing; a real one is copied out of the batch's buffer).
            window.hidden = kept if kept.stride(-1) == 0 else kept.clone()
            window.window = None

    def _tokens(self, chunks: list[MuseTalkChunk], n: int) -> torch.Tensor:
        """The batch's audio tokens [n, 50, 384], in the encoder's dtype (zeros where no window is)."""
        dtype = next((w.hidden.dtype for c in chunks for w, _, _ in c.audio if w.hidden is not None), torch.float32)
        flat = torch.zeros((n * ITEM_POSITIONS, 5, 384), dtype=dtype, device=self.device)
        start = 0
        for chunk in chunks:
            for window, rows, positions in chunk.audio:
                assert window.hidden is not None
                dst = torch.from_numpy(rows + start * ITEM_POSITIONS).to(self.device)
                src = torch.from_numpy(positions).to(self.device)
                flat[dst] = window.hidden[src].to(dtype)
            start += len(chunk)
        return flat.view(n, ITEM_POSITIONS * 5, 384)

    def process(self, chunks: list[MuseTalkChunk]) -> list[Part]:
        """One model batch for all chunks: 256 x 256 BGR faces, one output size."""
        n = sum(len(c) for c in chunks)
        latents = torch.cat([c.bank.tensor()[torch.from_numpy(c.rows).to(self.device)] for c in chunks])
        with self.streams.compute():
            self._encode(chunks)  # under the compute lock: two batch threads never encode one window
            tokens = self._tokens(chunks, n)
            faces = self.generator.forward_device(latents, tokens)
            # upstream: (image * 255).round() as uint8, RGB -> BGR; done on the compute stream, before a
            # CUDA graph's next replay reuses the output's buffer.
            out = (faces.float() * 255.0).round_().clamp_(0, 255).to(torch.uint8).flip(1).permute(0, 2, 3, 1)
            out = out.contiguous()
        if self.streams.enabled:
            out.record_stream(torch.cuda.current_stream(self.device))  # made there, read here
        assert out.shape[1:] == (FACE_SIZE, FACE_SIZE, 3), out.shape
        return [(range(n), out)]
