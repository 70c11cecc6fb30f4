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

Also here, the helpers both engines use: `BatchStreams` (the CUDA streams that overlap consecutive
batches) and `group_rows_by_size` (one gather per batch before the per-size resizes).
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Generic, Protocol, TypeVar

import numpy as np
import torch

from services.media.packed import PackedImages

# The images of one output size: their positions in the merged batch and a (k, h, w, 3) uint8 tensor.
Part = tuple[Sequence[int], torch.Tensor]


class BatchStreams:
    """The CUDA streams with which a model stage overlaps consecutive batches (pipeline_depth > 1).

    Each batch thread does its uploads, pre/post-processing and copy back on its own I/O stream
    (`io()`), and the model runs on one compute stream under a lock (`compute()`), because CUDA
    graphs reuse their static buffers: batch k+1's transfers and host work overlap batch k's
    compute. Disabled (overlap off, or the CPU), everything runs on the current stream and
    `compute()` is only the lock.
    """

    def __init__(self, device: torch.device, overlap: bool) -> None:
        self.device = device
        self.enabled = bool(overlap) and device.type == "cuda"
        self._compute = torch.cuda.Stream(device) if self.enabled else None
        self._lock = threading.Lock()
        self._local = threading.local()

    def io(self) -> contextlib.AbstractContextManager:
        """Run on this thread's I/O stream (made on first use); no change when disabled."""
        if not self.enabled:
            return contextlib.nullcontext()
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream(self.device)
        return torch.cuda.stream(stream)

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """The model's turn: under the lock, on the compute stream after it has waited for the
        caller's stream; on leaving, the caller's stream waits for the compute stream. A tensor made
        inside and read by the caller afterwards should be `record_stream`-ed on the caller's stream."""
        with self._lock:
            if self._compute is None:
                yield
                return
            caller = torch.cuda.current_stream(self.device)
            self._compute.wait_stream(caller)
            with torch.cuda.stream(self._compute):
                yield
            caller.wait_stream(self._compute)


Size = tuple[int, int]  # (width, height), cv2 order


def group_rows_by_size(
    rows: torch.Tensor, sizes: Sequence[Size], pin: bool
) -> tuple[torch.Tensor, list[tuple[Size, list[int]]]]:
    """Reorder `rows` (batch first) so that the rows of each output size are one contiguous slice.

    Returns the reordered rows and the groups in their order: [(size, positions in `rows`)]. Both
    engines resize per output size; one gather beats a gather per size. The index goes up through
    pinned memory without blocking: `torch.tensor(..., device=cuda)` would make the host wait for
    all queued work (the network) before it could queue the resizes.
    """
    groups: dict[Size, list[int]] = defaultdict(list)
    for k, size in enumerate(sizes):
        groups[size].append(k)
    if len(groups) > 1:
        order = torch.tensor([k for ks in groups.values() for k in ks], dtype=torch.int64)
        if pin:
            order = order.pin_memory()
        rows = rows.index_select(0, order.to(rows.device, non_blocking=True))
    return rows, list(groups.items())


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
            view, step = data.data, h * w * 3  # the array's memoryview
            for j, pos in enumerate(positions):
                views[pos] = view[j * step : (j + 1) * step]
                sizes[pos] = (w, h)
        results, pos = [], 0
        for length in lengths:
            chunk = range(pos, pos + length)
            joined = b"".join(views[i] for i in chunk)
            results.append(PackedImages([sizes[i][0] for i in chunk], [sizes[i][1] for i in chunk], joined))
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
