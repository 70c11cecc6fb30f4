"""A Generate stream's per-avatar rows kept on the device: sent once, read by index in every batch.

Both generator stages take an avatar's per-frame inputs once per stream instead of with every item:
the Wav2Lip stage its 96x96 reference crops (services/lipsync/engine.py `CropBank`), the 256 px
tier's stage its VAE latents (services/lipsync/musetalk/engine.py `LatentBank`). A `DeviceBank` is
that idea once: rows registered under the stream's own indices, uploaded in one copy at the next use,
an index sent again replaced in place, the count bounded per stream, and the items' indices mapped to
rows with an INVALID_ARGUMENT naming the first one the stream never sent.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np
import torch

from services.serving.errors import InvalidRequest, TooLarge

__all__ = ["DeviceBank"]


class DeviceBank:
    """One stream's rows of one shape and dtype, as one (N, *shape) tensor on the device.

    `noun` names a row in the errors ("crop", "latent"), `plural` the rows in the limit's ("reference
    crops", "latents")."""

    def __init__(
        self, device: torch.device, shape: tuple[int, ...], dtype: torch.dtype, limit: int, noun: str, plural: str
    ) -> None:
        self.device = device
        self.limit = limit
        self.noun, self.plural = noun, plural
        self._rows: dict[int, int] = {}
        self._pending: list[np.ndarray] = []
        self._tensor = torch.empty((0, *shape), dtype=dtype, device=device)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def put(self, indices: Iterable[int], rows: Iterable[np.ndarray]) -> None:
        """Register `rows` under `indices` (one message's worth); an index sent again is replaced.
        TooLarge, and nothing registered, when the new indices would pass the limit."""
        indices = [int(i) for i in indices]
        with self._lock:
            if len(self._rows) + len(set(indices) - self._rows.keys()) > self.limit:
                raise TooLarge(f"more than {self.limit} {self.plural} in one stream")
            replaced = False
            for index, row in zip(indices, rows, strict=True):
                if index not in self._rows:
                    self._rows[index] = len(self._rows)
                    self._pending.append(row)
                    continue
                self._flush()
                # The bank was (re)built inside the model thread's inference_mode (`tensor`), so it is an
                # inference tensor: updated in place only under inference_mode too (outside, torch refuses).
                with torch.inference_mode():
                    self._tensor[self._rows[index]] = torch.from_numpy(np.array(row)).to(self.device)
                replaced = True
            if replaced:
                self._settle()

    def rows(self, indices: np.ndarray, frame_indices: np.ndarray) -> np.ndarray:
        """Map the items' indices to bank rows; InvalidRequest naming the first unknown one."""
        rows = np.fromiter((self._rows.get(int(i), -1) for i in indices), dtype=np.int64, count=len(indices))
        if (rows < 0).any():
            bad = int(np.argmax(rows < 0))
            raise InvalidRequest(
                f"item for frame {int(frame_indices[bad])} names {self.noun} {int(indices[bad])}, which this stream has not sent"
            )
        return rows

    def tensor(self) -> torch.Tensor:
        """The rows on the device (the ones added since the last call uploaded first)."""
        with self._lock:
            self._flush()
            return self._tensor

    def _flush(self) -> None:
        """Upload the rows added since the last use in one copy (they arrive in messages of many)."""
        if self._pending:
            new = torch.from_numpy(np.stack(self._pending)).to(self.device)
            self._tensor = torch.cat((self._tensor, new))
            self._pending = []
            self._settle()

    def _settle(self) -> None:
        """Wait for this thread's stream to finish the upload: other threads read the bank on theirs.

        Rare (once per stream start, or when a row is replaced), so a synchronize is cheap enough.
        """
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
