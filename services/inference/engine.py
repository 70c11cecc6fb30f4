"""The device half of a model stage's engine: one merged batch of chunks in, one `PackedImages` per
chunk out, through one copy from the device.

Both model stages end a batch the same way: their images sit on the device as a few `(k, h, w, 3)`
uint8 tensors, one per output size (the resize groups items by size), each with the batch positions
of its items. `DeviceBatchEngine.run` takes those parts from a stage's `process` and brings them
back in a single device->host copy into pinned memory (torch caches pinned blocks), then cuts one
bytes object per chunk, in item order, on the model thread (the event loop only frames responses).
On the CPU there is no transfer: the parts' own buffers are read directly.

Why one home: the copy back, the per-position byte spans and the per-chunk packing were written
twice (lipsync's `_split_resized`, superres' `_to_bytes`) and had drifted (one concatenated on the
CPU, the other did not). A third model stage subclasses this and writes only `process`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

import numpy as np
import torch

from services.inference.device import BatchStreams
from services.media.packed import PackedImages

# The images of one output size: their positions in the merged batch and a (k, h, w, 3) uint8 tensor.
Part = tuple[Sequence[int], torch.Tensor]


class _Sized(Protocol):
    def __len__(self) -> int: ...


Chunk = TypeVar("Chunk", bound=_Sized)


class DeviceBatchEngine(abc.ABC, Generic[Chunk]):
    """Base of a model stage's batch engine: the device, its batch streams and the copy back.

    Thread-safe when `process` is: with the batcher's concurrency > 1 several batches are in `run`
    at once, each on its thread's I/O stream (`BatchStreams.io`); `process` takes the compute
    stream for the network itself (`self.streams.compute()`).
    """

    def __init__(self, device: torch.device, overlap: bool) -> None:
        self.device = device
        self._pin = device.type == "cuda"
        self.streams = BatchStreams(device, overlap)

    @abc.abstractmethod
    def process(self, chunks: list[Chunk]) -> list[Part]:
        """The batch's output images on the device, grouped by size; every position 0..n-1 once."""

    @torch.inference_mode()
    def run(self, chunks: list[Chunk]) -> list[PackedImages]:
        """One pass over all chunks' items; per chunk, its images packed in item order."""
        with self.streams.io():
            parts = self.process(chunks) if any(len(c) for c in chunks) else []
            return self.copy_back(parts, [len(c) for c in chunks])

    def copy_back(self, parts: list[Part], lengths: Sequence[int]) -> list[PackedImages]:
        """`parts` -> per chunk of `lengths` items, its images' bytes and sizes in item order."""
        n = sum(lengths)
        views: list[memoryview] = [memoryview(b"")] * n
        sizes: list[tuple[int, int]] = [(0, 0)] * n
        for (positions, images), data in zip(parts, self._to_host(parts)):
            _, h, w, _ = images.shape
            view, step = memoryview(data), h * w * 3
            for j, pos in enumerate(positions):
                views[pos] = view[j * step : (j + 1) * step]
                sizes[pos] = (w, h)
        results, pos = [], 0
        for length in lengths:
            chunk = range(pos, pos + length)
            data = b"".join(views[i] for i in chunk)
            results.append(PackedImages([sizes[i][0] for i in chunk], [sizes[i][1] for i in chunk], data))
            pos += length
        return results

    def _to_host(self, parts: list[Part]) -> list[np.ndarray]:
        """Each part's bytes on the host: on a GPU one copy for all parts (it waits for this thread's
        stream, and through it for the network); on the CPU the parts' own memory."""
        if self.device.type == "cpu":
            return [images.reshape(-1).numpy() for _, images in parts]
        if not parts:
            return []
        flats = [images.reshape(-1) for _, images in parts]
        flat = flats[0] if len(flats) == 1 else torch.cat(flats)
        host = torch.empty(flat.shape, dtype=torch.uint8, pin_memory=self._pin)
        host.copy_(flat)
        ends = np.cumsum([f.numel() for f in flats])
        return np.split(host.numpy(), ends[:-1])
