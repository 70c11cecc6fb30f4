"""The superres stage's batch engine: all per-crop maths on the model's device, one copy back.

Each Upscale request message becomes one `UpscaleChunk` (its crops stacked per input size, and the
(width, height) each item must come back at); the dynamic batcher merges chunks from all streams
and `SuperResEngine.run` does the whole batch on the device: upload the uint8 crops (one copy per
input size), BGR->RGB and /255, reflect pad for the model's scale, the network (in the upscaler's
dtype, channels_last on CUDA), crop the padding off, clamp/*255/round exactly as
`process.from_model_output`, resize to each item's paste size with OpenCV's LANCZOS4 done as two
matrix products (`services.superres.lanczos`, fixed-point weights: the same uint8 result as
`cv2.resize`), RGB->BGR, uint8; `DeviceBatchEngine` copies the whole batch back once.
The weight-free `LanczosUpscaler` runs the resize alone, on the same device. On the CPU the resize
defaults to cv2 per item (faster there than the dense matrix products; see `resize`).

Why: the per-crop CPU path (`ModelUpscaler.upscale`) copied the fp32 384x384x3 output (1.7 MB a
crop) to the host and resized it with cv2 there; on a GPU that host I/O, not the network, set the
pace (bench_models.py, e2e column; docs/performance.md). The result matches that CPU path within one uint8 level
(tests/unit/superres/test_engine.py). On a CPU the same code runs with CPU tensors (what CI runs,
with both resize variants).

Several batches can be in `run` at once (the service's `pipeline_depth`, the batcher's concurrency):
with `overlap` on a GPU, each thread uploads, prepares, resizes and copies back on its own CUDA
stream while the network runs on one compute stream under a lock, as in `LipSyncEngine`, so batch
k+1's host work and transfers overlap batch k's compute.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

import cv2
import numpy as np
import torch

from services.inference.backends import Backend
from services.inference.engine import DeviceBatchEngine, Part, Size, group_rows_by_size
from services.superres.lanczos import lanczos4_resize, round_like_opencv
from services.superres.upscaler import LanczosUpscaler, ModelUpscaler, pad_multiple, reflect_pad

__all__ = ["SuperResEngine", "UpscaleChunk"]


@dataclasses.dataclass
class UpscaleChunk:
    """The items of one request message: what the batcher queues (never split across batches).

    Attributes:
        groups: per distinct input size, (item positions (k,) int64, its k (h, w, 3) uint8 BGR crops).
            The crops are not stacked here: the engine copies them once, into its upload buffer.
        sizes: per item, the (width, height) to return.
    """

    groups: list[tuple[np.ndarray, list[np.ndarray]]]
    sizes: list[Size]

    def __len__(self) -> int:
        return len(self.sizes)

    @classmethod
    def from_items(cls, crops: Sequence[np.ndarray], sizes: Sequence[Size]) -> UpscaleChunk:
        """Group (h, w, 3) uint8 crops by size; `sizes` are (w, h) per item."""
        if len(crops) != len(sizes):
            raise ValueError(f"got {len(sizes)} output sizes for {len(crops)} crops")
        by_shape: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, crop in enumerate(crops):
            if crop.dtype != np.uint8 or crop.ndim != 3 or crop.shape[2] != 3:
                raise ValueError(f"crop {i} must be a (H, W, 3) uint8 array, got {crop.dtype} {crop.shape}")
            by_shape[crop.shape].append(i)
        groups = [(np.asarray(idx, np.int64), [crops[i] for i in idx]) for idx in by_shape.values()]
        out_sizes = [(int(w), int(h)) for w, h in sizes]
        if any(w <= 0 or h <= 0 for w, h in out_sizes):
            raise ValueError(f"output sizes must be positive, got {out_sizes}")
        return cls(groups, out_sizes)


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    current = torch.cuda.current_device()
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)


class SuperResEngine(DeviceBatchEngine[UpscaleChunk]):
    """Runs merged batches of chunks through an upscaler, on its device.

    Args:
        upscaler: a `ModelUpscaler` (its scale is used; without a backend also its network and
            dtype, the network switched to channels_last on CUDA, in place) or the weight-free
            `LanczosUpscaler` (resize only).
        device: where the maths runs: the backend's device, else the model's (default: that
            device; "cpu" for the Lanczos fallback).
        max_batch: largest number of crops one forward pass sees (a chunk bigger than this is run
            in slices, which bounds the activation memory); None = no limit.
        channels_last: NHWC activations for the network; None = the backend's choice, else on for
            CUDA, off on the CPU.
        resize: "torch" (`lanczos4_resize`, two matrix products on the device) or "cv2" (per item
            on the host, exactly the CPU path); None = "torch" on a GPU, "cv2" on the CPU, where the
            dense matrix products take about twice as long as cv2's 8-tap loops (measured: 64 crops
            96 px -> 150x170 and 384x384, Lanczos fallback, 2 cores).
        backend: runs the network on its own copy of the weights (services.inference.backends: fp16,
            CUDA graphs per batch bucket); the upscaler's module is then not run here, and may stay
            on the CPU in fp32 (the service keeps it there as the numerics guard's reference).
            None = call the upscaler's module directly. Its output is consumed before the next call.
        overlap: on CUDA, let concurrent `run` calls (the batcher's concurrency > 1) overlap: a CUDA
            stream per thread for uploads, pre/post-processing, resize and the copy back, one compute
            stream for the network, under a lock. Off (and always on the CPU) a lock runs one batch
            at a time on the current stream.
    """

    def __init__(
        self,
        upscaler: ModelUpscaler | LanczosUpscaler,
        device: str | torch.device | None = None,
        *,
        max_batch: int | None = None,
        channels_last: bool | None = None,
        resize: str | None = None,
        backend: Backend | None = None,
        overlap: bool = False,
    ) -> None:
        self.upscaler = upscaler
        self.backend = backend
        self.model_name = upscaler.model_name
        self.max_batch = max_batch if max_batch and max_batch > 0 else None
        if isinstance(upscaler, ModelUpscaler):
            # The network runs where its runner is: the backend's device and dtype, else the model's.
            where = backend.device if backend is not None else upscaler.device
            if device is not None and not _same_device(torch.device(device), where):
                raise ValueError(f"the model lives on {where}, not {device}")
            self.device = where
            self.model: torch.nn.Module | None = upscaler.model
            self.dtype = backend.spec.dtype if backend is not None else upscaler.dtype
            self.scale = upscaler.scale
        else:
            self.device = torch.device(device or "cpu")
            self.model = None
            self.dtype = torch.float32
            self.scale = 1
        if channels_last is None:
            channels_last = backend.spec.channels_last if backend is not None else self.device.type == "cuda"
        self.channels_last = bool(channels_last)
        if self.model is not None and self.channels_last and backend is None:
            self.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs omit memory_format; a backend lays out its own copy
        self.resize = resize or ("cv2" if self.device.type == "cpu" else "torch")
        if self.resize not in ("torch", "cv2") or (self.resize == "cv2" and self.device.type != "cpu"):
            raise ValueError(f"resize must be 'torch', or 'cv2' on the CPU; got {resize!r} on {self.device}")
        super().__init__(self.device, overlap)

    def process(self, chunks: list[UpscaleChunk]) -> list[Part]:
        """The network (or the Lanczos resize alone) on all chunks' items, grouped by output size.

        Several batches may be in here at once (on CUDA with `overlap`, each on its thread's I/O
        stream); the network runs one batch at a time (`BatchStreams.compute`).
        """
        sizes: list[Size] = [size for chunk in chunks for size in chunk.sizes]
        # Items of all chunks with the same input size share an upload and forward passes.
        by_shape: dict[tuple[int, ...], list[tuple[np.ndarray, list[np.ndarray]]]] = defaultdict(list)
        offset = 0
        for chunk in chunks:
            for positions, crops in chunk.groups:
                by_shape[crops[0].shape].append((positions + offset, crops))
            offset += len(chunk)
        parts: list[Part] = []
        for group in by_shape.values():
            items = np.concatenate([p for p, _ in group])
            uploaded = self._upload([c for _, cs in group for c in cs])
            step = self.max_batch or len(items)
            for start in range(0, len(items), step):
                idx = items[start : start + step].tolist()
                for ks, images in self._process(uploaded[start : start + step], [sizes[i] for i in idx]):
                    parts.append(([idx[k] for k in ks], images))
        return parts

    def _upload(self, crops: list[np.ndarray]) -> torch.Tensor:
        """Same-size (h, w, 3) uint8 crops -> one (n, h, w, 3) device tensor: one host copy, one upload."""
        host = torch.empty((len(crops), *crops[0].shape), dtype=torch.uint8, pin_memory=self._pin)
        np.stack(crops, out=host.numpy())
        return host.to(self.device, non_blocking=True)

    def _process(self, crops: torch.Tensor, sizes: list[Size]) -> list[tuple[list[int], torch.Tensor]]:
        """(n, h, w, 3) uint8 BGR on the device -> (positions in `crops`, (k, oh, ow, 3) uint8 BGR) per output size."""
        if self.model is None:
            # Weight-free fallback: resize the crop itself (BGR throughout, nothing to flip).
            return self._resize_split(crops.permute(0, 3, 1, 2), sizes)
        h, w = crops.shape[1:3]
        s = self.scale
        # Same maths as process.to_model_input: BGR->RGB, /255 in float32, then the model's dtype.
        x = crops.flip(-1).permute(0, 3, 1, 2).to(torch.float32).div_(255.0).to(self.dtype)
        x, _, _ = reflect_pad(x, pad_multiple(s))  # right/bottom, to the multiple the network needs
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        net = self.backend.forward_device if self.backend is not None else self.model
        with self.streams.compute():
            y = net(x)[:, :, : h * s, : w * s]
            # process.from_model_output in float32: clamp, *255, round half to even, RGB->BGR. These
            # are the exact uint8 values the CPU path hands to cv2, still as floats for the resize.
            # On the compute stream: `y` may be a CUDA graph's output, reused by the next replay.
            img = y.float().clamp(0, 1).mul_(255.0).round_().flip(1)
        if self.streams.enabled:
            img.record_stream(torch.cuda.current_stream(self.device))  # made there, read here: no early reuse
        return self._resize_split(img, sizes)

    def _resize_split(self, img: torch.Tensor, sizes: list[Size]) -> list[tuple[list[int], torch.Tensor]]:
        """(n, 3, H, W) integer-valued BGR (float or uint8) -> per distinct output size, (positions in
        `img`, (k, oh, ow, 3) uint8 BGR, contiguous).

        One resize per distinct output size (a few kernels each, ~0.1 ms of host time per group).
        """
        if self.resize == "cv2":
            return self._resize_split_cv2(img, sizes)
        img, groups = group_rows_by_size(img, sizes, self._pin)  # one resize per output size
        in_h, in_w = img.shape[2:]
        out = []
        start = 0
        for (ow, oh), ks in groups:
            g = img[start : start + len(ks)]
            start += len(ks)
            if (oh, ow) != (in_h, in_w):
                # cv2.resize(uint8, INTER_LANCZOS4): fixed-point weights, round half up, saturate.
                g = round_like_opencv(lanczos4_resize(g.float(), (oh, ow), fixed_point=True))
            else:
                g = g.to(torch.uint8)
            out.append((ks, g.permute(0, 2, 3, 1).contiguous()))
        return out

    @staticmethod
    def _resize_split_cv2(img: torch.Tensor, sizes: list[Size]) -> list[tuple[list[int], torch.Tensor]]:
        """The CPU variant of `_resize_split`: cv2.resize per item on the uint8 image (process.py's path)."""
        hwc = img.to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
        in_h, in_w = hwc.shape[1:3]
        out = []
        for k, (ow, oh) in enumerate(sizes):
            item = (
                hwc[k] if (oh, ow) == (in_h, in_w) else cv2.resize(hwc[k], (ow, oh), interpolation=cv2.INTER_LANCZOS4)
            )
            out.append(([k], torch.from_numpy(np.ascontiguousarray(item))[None]))
        return out

    def warmup(self, batch_size: int = 1, size: Size = (96, 96), out_size: Size | None = None) -> None:
        """One dummy batch through `run` (kernels, allocator, resize matrices) before the first request."""
        w, h = size
        # Default: the network's native size (no resize); the Lanczos fallback x2 (a resize).
        scale = self.scale if self.model is not None else 2
        out = out_size or (w * scale, h * scale)
        crops = [np.zeros((h, w, 3), np.uint8)] * batch_size
        self.run([UpscaleChunk.from_items(crops, [out] * batch_size)])
