"""Compositing in I420: the avatar's frames converted once, only the face box blended per output frame.

The gateway's path (`services.render.reference.paste_face` then `to_yuv420`) blends the face into a
full BGR frame and converts the whole frame to I420 for x264. A render worker instead keeps the
avatar in I420 (`I420Frames`, converted once, memory-mapped from a local .npy) and per output frame
(`Compositor.frame`) copies the cached frame and re-computes only the planes' region that the
lip-sync model regenerates: the lower part of the face box, from box row ``height / 2`` down (row 48
of Wav2Lip's 96 px crop; the upper half of its crop is the reference input, so pasting it back only
blurs the eyes through the 96 px round trip). Above that row the frame keeps the template's own
bytes, Y, U and V, bit for bit; the blend mask is the feather mask's (left, right, bottom) times a
smoothstep top edge from 0 on the first regenerated row up to 1 over ``0.075 * height`` rows
(`blend_mask`, `top_ramp`). ``regenerated_from=0`` pastes the whole box, as `paste_face` does:

* the face is converted to I420 on its own, after padding it (edge replicate) to the box expanded
  to even coordinates, so its chroma samples sit on the frame's 2x2 chroma grid;
* Y is blended over the region with the mask, full resolution; U and V over the chroma blocks
  with the mask sampled the way OpenCV subsamples chroma (see below);
* everything else is the cached frame's bytes.

Why this matches the reference: the BGR -> YUV conversion is affine, so blending in YUV with the
same mask equals blending in BGR and then converting, up to rounding. OpenCV's BGR2YUV_I420 takes
each 2x2 block's U/V from the block's top-left pixel alone (checked once, see `chroma_siting`; a
build that averages the 4 pixels gets a 2x2-averaged mask instead), so the reference's chroma of a
block is that of the blended top-left pixel: sampling the mask there reproduces it, and blocks whose
top-left pixel lies outside the box are left untouched, exactly as the reference leaves them.
Measured against the same blend in BGR then ``to_yuv420`` (``to_yuv420(paste_face(...))`` for the
whole box): Y, U and V within 1 level (see the tests); outside the region's even-expanded extent
the bytes are identical.

**Alpha masks (the musetalk tier; docs/architecture.md section 12).** A compositor given `AlphaMasks`
blends each generated face through its avatar frame's own alpha (upstream MuseTalk's
`get_image_blending`): the 256x256 face resized to the box (bilinear, as upstream's `cv2.resize`), the
frame's 256x256 mask resized back over its 1.5x square and read over the box (outside the box the
blend would give the frame's own pixels: upstream pastes the face into a copy of the square), and the
region blended is the box's rows from the first the mask touches (it is 0 above the square's middle
row, the box's), so the upper face keeps the template's bytes. The same I420 blend as above, with the
2-D mask in place of the separable feather (`_mask_weights`); a `weight` < 1 scales the mask (the
tier's noise gate fades the generated mouth in and out: services/media/speech.py).

Cost (bench/bench_composite.py, one thread, 2-core Xeon VM, median): 0.29 ms per 720p frame with a
360x400 box (the lower half) against 0.49 ms for the whole box and 2.4 ms for the reference path;
0.75 against 1.20 and 5.0 ms at 1080p with 520x600. The parts at 720p (whole box; the lower half
converts and blends half as many pixels): copying the cached frame (~0.08 ms), padding and converting the face (~0.07 ms),
three `cv2.blendLinear` calls writing straight into the copy's planes (~0.16 ms), Python (~0.05 ms);
all but the last release the GIL. The weights (mask, 1 - mask, chroma-sampled versions) are kept
per box geometry in a small per-thread cache; a geometry not in it costs ~0.1-0.2 ms more (see
`_weights`).
"""

from __future__ import annotations

import functools
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np

from services.media.video_format import split_i420

Box = tuple[int, int, int, int]

__all__ = ["REGENERATED_FROM", "AlphaMasks", "Compositor", "I420Frames", "blend_mask", "chroma_siting"]

#: Where the lip-sync model's regenerated rows start, as a fraction of the face box height: Wav2Lip
#: regenerates rows 48-95 of its 96x96 crop (the upper half is its reference input).
REGENERATED_FROM = 0.5


# --------------------------------------------------------------------------------------------------
# The avatar's frames in I420
# --------------------------------------------------------------------------------------------------


class I420Frames:
    """An avatar's frames in I420, converted once: one ``(count, height * 3 // 2, width)`` uint8 array.

    Each frame is what `services.media.video_format.to_yuv420` returns for the BGR frame (Y plane, then
    U, then V, BT.601 limited range), the layout `Mp4Writer.write_yuv420` takes. The array is
    read-only: in memory it is shared by every compositor thread, and `load` memory-maps it.
    """

    def __init__(self, data: np.ndarray) -> None:
        """Wraps an existing ``(count, height * 3 // 2, width)`` uint8 array (not copied; made read-only).

        Raises:
            ValueError: The array has the wrong rank, dtype or size (height and width must be even).
        """
        if not isinstance(data, np.ndarray) or data.ndim != 3 or data.dtype != np.uint8:
            raise ValueError(
                f"I420 frames must be a (count, height * 3 / 2, width) uint8 array, got {getattr(data, 'shape', type(data))} {getattr(data, 'dtype', '')}"
            )
        count, rows, width = data.shape
        if count < 1 or rows == 0 or width == 0 or rows % 3 or (rows * 2 // 3) % 2 or width % 2:
            raise ValueError(
                f"I420 frames of shape {data.shape}: need count >= 1, rows = height * 3 / 2 and even height and width"
            )
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        if data.flags.writeable:
            data = data.view()
            data.setflags(write=False)
        self._data = data

    @classmethod
    def from_bgr(cls, frames: np.ndarray | Iterable[np.ndarray]) -> I420Frames:
        """Converts BGR frames: a ``(count, H, W, 3)`` uint8 array (or a sequence of ``(H, W, 3)`` frames), H and W even.

        Each frame goes through ``cv2.cvtColor(frame, cv2.COLOR_BGR2YUV_I420)``, the conversion
        `to_yuv420` uses, written straight into the result.
        """
        if not isinstance(frames, np.ndarray):
            frames = list(frames)
            if not frames:
                raise ValueError("no frames")
        count = len(frames)
        first = np.asarray(frames[0])
        if count == 0 or first.ndim != 3 or first.shape[2] != 3 or first.dtype != np.uint8:
            raise ValueError(
                f"BGR frames must be (count, H, W, 3) uint8, got {count} frames of {first.shape} {first.dtype}"
            )
        height, width = first.shape[:2]
        if height % 2 or width % 2:
            raise ValueError(f"I420 needs an even frame size, got {width}x{height}")
        out = np.empty((count, height * 3 // 2, width), np.uint8)
        for i in range(count):
            frame = frames[i]
            if frame.shape != first.shape or frame.dtype != np.uint8:
                raise ValueError(f"frame {i} is {frame.shape} {frame.dtype}, frame 0 is {first.shape} uint8")
            converted = cv2.cvtColor(frame, cv2.COLOR_BGR2YUV_I420, dst=out[i])
            if converted is not out[i] and not np.shares_memory(converted, out):  # pragma: no cover - cv2 reallocated
                out[i] = converted
        return cls(out)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Writes the frames as a .npy file (atomically: a temporary name renamed to ``path``); returns ``path``.

        The name is taken as given (np.save would otherwise append ``.npy`` to a name without it).
        """
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                np.save(f, self._data, allow_pickle=False)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str], mmap: bool = True) -> I420Frames:
        """Reads frames written by `save`; with ``mmap`` (the default) the file is memory-mapped read-only.

        Memory-mapped, the frames are paged in from the page cache as they are used and shared by every
        process of the machine that maps the same file.
        """
        data = np.load(Path(path), mmap_mode="r" if mmap else None, allow_pickle=False)
        return cls(data)

    @property
    def data(self) -> np.ndarray:
        """The read-only ``(count, height * 3 // 2, width)`` uint8 array (an np.memmap when loaded with mmap)."""
        return self._data

    @property
    def count(self) -> int:
        return self._data.shape[0]

    @property
    def width(self) -> int:
        return self._data.shape[2]

    @property
    def height(self) -> int:
        return self._data.shape[1] * 2 // 3

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> np.ndarray:
        """Frame ``index`` as a read-only ``(height * 3 // 2, width)`` view."""
        return self._data[index]

    def __repr__(self) -> str:
        return f"I420Frames(count={self.count}, width={self.width}, height={self.height})"


# --------------------------------------------------------------------------------------------------
# Compositing
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def chroma_siting() -> str:
    """How this OpenCV's BGR2YUV_I420 computes a 2x2 block's U/V: ``"top-left"`` (that pixel alone) or ``"average"``.

    OpenCV 4.x takes the top-left pixel; the compositor samples its mask the same way so that its
    chroma matches `to_yuv420`'s. Any other behaviour is treated as averaging the 4 pixels.
    """
    block = np.zeros((2, 2, 3), np.uint8)
    block[0, 0] = (255, 0, 0)  # pure blue top-left: U far above 128; the rest black (U = 128)
    u = int(cv2.cvtColor(block, cv2.COLOR_BGR2YUV_I420)[2, 0])
    top_left = int(cv2.cvtColor(np.full((2, 2, 3), (255, 0, 0), np.uint8), cv2.COLOR_BGR2YUV_I420)[2, 0])
    return "top-left" if u == top_left else "average"


@functools.lru_cache(maxsize=4096)
def _profiles(height: int, width: int, feather: float, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The blend mask's vertical profile over box rows ``[start, height)`` and horizontal profile (width,), float32 (cached).

    `feather_mask` is the outer product of one ramp per dimension, and a 1-pixel-wide (or -high)
    mask has no ramp across (a ramp shorter than a pixel is all ones), so ``feather_mask(h, 1)`` is
    the vertical profile itself. The 2-D weights are built from the profiles (the tests check that
    the product equals ``feather_mask(h, w)``), which is cheaper than going through the 2-D mask.

    With ``start > 0`` (the regenerated region begins on box row ``start``) the vertical profile is
    the box's one from row ``start`` on, times a smoothstep from 0 on row ``start`` itself up to 1
    over ``top_ramp(height, feather)`` rows: the feathered top edge of the pasted region.
    """
    ry = feather_mask(height, 1, feather)[:, 0, 0]
    rx = feather_mask(1, width, feather)[0, :, 0]
    if start <= 0:
        return ry, rx
    ramp = top_ramp(height, feather)
    t = (
        np.clip(np.arange(height - start, dtype=np.float64) / ramp, 0.0, 1.0)
        if ramp >= 1.0
        else np.ones(height - start)
    )
    if ramp >= 1.0:
        t = t * t * (3.0 - 2.0 * t)
    ry = (ry[start:].astype(np.float64) * t).astype(np.float32)
    ry.setflags(write=False)
    return ry, rx


def top_ramp(height: int, feather: float) -> float:
    """Rows over which the regenerated region's top edge ramps up: half the other edges' ramp.

    Half the ramp (7 rows of the model's 96, rows 48-55) keeps the lips (rows ~57-70 of 96) at full
    weight while the edge still spans 0.075 of the box height (30 px on a 400 px box): no seam. A
    ramp under one pixel gives a hard edge.
    """
    return feather * height / 2


def regenerated_start(height: int, regenerated_from: float) -> int:
    """The first box row the model regenerates: ``floor(height * regenerated_from)`` (row 48 of 96 -> height / 2)."""
    return min(height - 1, int(height * regenerated_from))


def blend_mask(height: int, width: int, feather: float = 0.15, regenerated_from: float = 0.5) -> np.ndarray:
    """The compositor's Y blend weights over the whole ``(height, width)`` box, float32 (0 above the regenerated region).

    With ``regenerated_from=0`` it is ``feather_mask(height, width, feather)[:, :, 0]``.
    """
    start = regenerated_start(height, regenerated_from) if regenerated_from > 0 else 0
    ry, rx = _profiles(height, width, feather, start)
    mask = np.zeros((height, width), np.float32)
    mask[start:] = np.outer(ry, rx)
    return mask


_SLOTS_PER_THREAD = 8  # box geometries whose weights a thread keeps
_HEADROOM = 1.3  # a new slot buffer holds 30 % more than its geometry needs, so slightly larger boxes reuse it


def _outer(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out[i, j] = a[i] * b[j] (float32). cv2.gemm: bit-identical to np.multiply.outer and 2.5x faster."""
    if out.size == 0:
        return
    result = cv2.gemm(np.ascontiguousarray(a)[:, None], np.ascontiguousarray(b)[None, :], 1.0, None, 0.0, dst=out)  # type: ignore[call-overload]  # stubs: src3 may be None
    if result is not out:  # pragma: no cover - cv2 reallocated dst
        out[...] = result


class _Weights:
    """The blend weights of one box geometry, views into ``buffer`` (see `_weights`)."""

    __slots__ = ("buffer", "wy", "wy_inv", "wc", "wc_inv", "rows", "cols")

    def __init__(
        self,
        buffer: np.ndarray,
        ry: np.ndarray,
        rx: np.ndarray,
        cy: np.ndarray,
        cx: np.ndarray,
        rows: slice,
        cols: slice,
    ) -> None:
        self.buffer = buffer
        self.rows, self.cols = rows, cols
        views = []
        offset = 0
        for shape in ((len(ry), len(rx)), (len(ry), len(rx)), (len(cy), len(cx)), (len(cy), len(cx))):
            size = shape[0] * shape[1]
            views.append(buffer[offset : offset + size].reshape(shape))  # contiguous views
            offset += size
        self.wy, self.wy_inv, self.wc, self.wc_inv = views
        _outer(ry, rx, self.wy)
        np.subtract(np.float32(1.0), self.wy, out=self.wy_inv)
        _outer(cy, cx, self.wc)
        np.subtract(np.float32(1.0), self.wc, out=self.wc_inv)

    @staticmethod
    def floats(height: int, width: int, chroma_height: int, chroma_width: int) -> int:
        return 2 * (height * width + chroma_height * chroma_width)


class _MaskWeights(NamedTuple):
    """The blend weights of one face through a 2-D alpha mask (`_mask_weights`): `_Weights`' fields."""

    wy: np.ndarray
    wy_inv: np.ndarray
    wc: np.ndarray
    wc_inv: np.ndarray
    rows: slice
    cols: slice


def _mask_weights(alpha: np.ndarray, top: int, left: int, bottom: int, right: int, siting: str) -> _MaskWeights:
    """`_Weights` for a 2-D float32 mask over the region (its rows x cols): Y weights are the mask, the
    chroma blocks' the mask where OpenCV samples chroma (the top-left pixel of each block inside the
    region, or the 2x2 mean with the padding at 0), as `_weights` derives them from its profiles."""
    wy = np.ascontiguousarray(alpha, dtype=np.float32)
    if siting == "top-left":
        wc = np.ascontiguousarray(wy[top::2, left::2])
        rows, cols = slice(top, top + wc.shape[0]), slice(left, left + wc.shape[1])
    else:
        padded = np.pad(wy, ((top, bottom), (left, right)))
        h, w = padded.shape
        wc = padded.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3), dtype=np.float32)
        rows, cols = slice(0, wc.shape[0]), slice(0, wc.shape[1])
    return _MaskWeights(wy, 1.0 - wy, wc, 1.0 - wc, rows, cols)


class AlphaMasks:
    """A `musetalk` avatar's alpha masks (services/jobs/avatars.py's pack): per frame with a face a
    256x256 uint8 alpha over its 1.5x square (`mask_boxes`), 255 = the generated face.

    Args:
        masks: (K, 256, 256) uint8 (a memory map is fine: a frame's mask is read when it is blended).
        mask_boxes: per avatar frame its square (x1, y1, x2, y2), or None (no face).
        rows: avatar frame -> its row of `masks`.
    """

    def __init__(self, masks: np.ndarray, mask_boxes: Sequence[Box | None], rows: Mapping[int, int]) -> None:
        if masks.ndim != 3 or masks.dtype != np.uint8:
            raise ValueError(f"alpha masks must be (K, H, W) uint8, got {masks.shape} {masks.dtype}")
        missing = [f for f in rows if f >= len(mask_boxes) or mask_boxes[f] is None or not 0 <= rows[f] < len(masks)]
        if missing:
            raise ValueError(f"frames {missing[:5]} have a mask row but no mask box or row")
        self._masks = masks
        self._boxes = list(mask_boxes)
        self._rows = dict(rows)

    def over_box(self, frame_index: int, box: Box) -> np.ndarray:
        """The frame's alpha over `box` (inside its square): (h, w) float32 in [0, 1]."""
        row = self._rows.get(frame_index)
        square = self._boxes[frame_index] if frame_index < len(self._boxes) else None
        if row is None or square is None:
            raise ValueError(f"frame {frame_index} has no alpha mask")
        sx1, sy1, sx2, sy2 = square
        x1, y1, x2, y2 = box
        alpha = np.zeros((y2 - y1, x2 - x1), np.float32)
        full = cv2.resize(np.asarray(self._masks[row]), (sx2 - sx1, sy2 - sy1), interpolation=cv2.INTER_LINEAR)
        # the box's part inside the square (the square holds the box, but guard a hand-made one)
        ax1, ay1, ax2, ay2 = max(x1, sx1), max(y1, sy1), min(x2, sx2), min(y2, sy2)
        if ax2 > ax1 and ay2 > ay1:
            part = full[ay1 - sy1 : ay2 - sy1, ax1 - sx1 : ax2 - sx1]
            alpha[ay1 - y1 : ay2 - y1, ax1 - x1 : ax2 - x1] = part * np.float32(1.0 / 255.0)
        return alpha


class _FaceRegion(NamedTuple):
    """A face ready to blend: its I420 planes over the even-expanded region, the blend weights, the
    box it is blended into (from the regenerated row on) and the expansion's top and left."""

    y: np.ndarray
    u: np.ndarray
    v: np.ndarray
    weights: _Weights | _MaskWeights
    box: tuple[int, int, int, int]
    top: int
    left: int


class _ThreadWeights(threading.local):
    """Each thread's LRU of `_Weights` (thread-local, so a slot is never rewritten while another thread blends with it)."""

    def __init__(self) -> None:
        self.slots: OrderedDict[tuple, _Weights] = OrderedDict()


_THREAD_WEIGHTS = _ThreadWeights()


def _weights(
    height: int, width: int, top: int, left: int, bottom: int, right: int, feather: float, siting: str, start: int = 0
) -> _Weights:
    """The blend weights of one box geometry, from this thread's cache.

    ``wy`` is the feather mask over the box's rows ``[start, height)`` (``height - start``, width)
    (``start`` > 0: the regenerated region, see `_profiles`) and ``wy_inv`` is 1 - wy; ``wc`` covers
    the chroma blocks ``rows x cols`` (slices of the even-expanded region's blocks) with the mask as
    OpenCV subsamples it, and ``wc_inv`` is 1 - wc. ``top``/``left``/``bottom``/``right`` (0 or 1) is the
    padding that expands that region to even coordinates. 10 bytes per box pixel: 1.4 MB for 360x400.

    Why a per-thread LRU of recycled buffers rather than an lru_cache of fresh arrays: a template
    video's smoothed boxes change size on most frames, and a fresh 1.4 MB of weights costs ~350 page
    faults (about 0.5 ms on a VM) before the ~0.15 ms of arithmetic; an evicted slot's buffer is
    rewritten in place instead. Memory: at most 8 slots per compositing thread (~15 MB at 720p).
    """
    key = (height, width, top, left, feather, siting, start)
    slots = _THREAD_WEIGHTS.slots
    found = slots.get(key)
    if found is not None:
        slots.move_to_end(key)
        return found
    ry, rx = _profiles(height, width, feather, start)
    if siting == "top-left":
        # Blocks whose top-left pixel is inside the box: rows/cols from `top`/`left` on (the first
        # block starts on the padding when the box starts on an odd coordinate and keeps the template).
        cy, cx = ry[top::2], rx[left::2]
        rows, cols = slice(top, top + len(cy)), slice(left, left + len(cx))
    else:
        # The 2x2 block means of an outer product are the outer product of the pair means.
        py = np.concatenate([np.zeros(top, np.float32), ry, np.zeros(bottom, np.float32)])
        px = np.concatenate([np.zeros(left, np.float32), rx, np.zeros(right, np.float32)])
        cy, cx = py.reshape(-1, 2).mean(axis=1, dtype=np.float32), px.reshape(-1, 2).mean(axis=1, dtype=np.float32)
        rows, cols = slice(0, len(cy)), slice(0, len(cx))
    need = _Weights.floats(len(ry), len(rx), len(cy), len(cx))
    buffer = None
    if len(slots) >= _SLOTS_PER_THREAD:
        _, evicted = slots.popitem(last=False)
        if evicted.buffer.size >= need:
            buffer = evicted.buffer
    if buffer is None:
        buffer = np.empty(int(need * _HEADROOM), np.float32)
    weights = _Weights(buffer, ry, rx, cy, cx, rows, cols)
    slots[key] = weights
    return weights


def _blend(face: np.ndarray, base: np.ndarray, w: np.ndarray, w_inv: np.ndarray) -> None:
    """base[...] = round(w * face + (1 - w) * base), in place (``base`` is a view into the output frame)."""
    if base.size == 0:  # e.g. a 1-pixel box at odd coordinates covers no chroma block's top-left pixel
        return
    result = cv2.blendLinear(face, base, w, w_inv, dst=base)
    if result is not base and not np.shares_memory(result, base):  # pragma: no cover - cv2 reallocated dst
        base[...] = result


class Compositor:
    """Output frames of one avatar in I420: the cached frame, with a generated face blended into its box.

    ``Compositor(frames, boxes).frame(i, face)`` matches
    ``to_yuv420(paste_face(bgr_frames[i], face, boxes[i]))`` within a level or two (see the module
    docstring) at a fraction of the cost. Thread-safe: `frame` only reads shared state (the blend
    weights are cached per thread), and its OpenCV calls release the GIL, so a pool of compositing
    threads scales.
    """

    def __init__(
        self,
        frames: I420Frames,
        boxes: Sequence[Box | None],
        feather: float = 0.15,
        regenerated_from: float = REGENERATED_FROM,
        alpha: AlphaMasks | None = None,
    ) -> None:
        """
        Args:
            frames: The avatar's frames in I420.
            boxes: Per avatar frame, the face box ``(x1, y1, x2, y2)`` (x2/y2 exclusive) or None.
            feather: The feather mask's ramp (`feather_mask` below), as `paste_face` uses.
            regenerated_from: Where the pasted region starts, as a fraction of the box height: 0.5
                (row 48 of the model's 96, the rows Wav2Lip regenerates; above it the template's own
                pixels stay, bit for bit), or 0 to paste the whole box (what `paste_face` does).
            alpha: The avatar's per-frame alpha masks (the musetalk tier): faces of any size are
                resized to the box and blended through the frame's mask instead of the feather
                (`feather` and `regenerated_from` are then unused).

        Raises:
            ValueError: ``boxes`` does not have one entry per frame, or a box is empty or outside the frame.
        """
        if len(boxes) != frames.count:
            raise ValueError(f"{len(boxes)} boxes for {frames.count} frames: need one (or None) per frame")
        if not 0.0 <= feather <= 0.5:
            raise ValueError(f"feather must be in [0, 0.5], got {feather}")
        if not 0.0 <= regenerated_from < 1.0:
            raise ValueError(f"regenerated_from must be in [0, 1), got {regenerated_from}")
        self._regenerated_from = float(regenerated_from)
        self._alpha = alpha
        self._frames = frames
        self._data = frames.data.view(np.ndarray)  # a plain (read-only) ndarray, also over a memory map
        self._height = frames.height
        self._width = frames.width
        self._feather = float(feather)
        self._siting = chroma_siting()
        self._boxes: list[Box | None] = []
        for i, box in enumerate(boxes):
            if box is None:
                self._boxes.append(None)
                continue
            x1, y1, x2, y2 = (int(v) for v in box)
            if not (0 <= x1 < x2 <= self._width and 0 <= y1 < y2 <= self._height):
                raise ValueError(
                    f"box {tuple(box)} of frame {i} is empty or outside the {self._width}x{self._height} frame"
                )
            self._boxes.append((x1, y1, x2, y2))

    @property
    def frames(self) -> I420Frames:
        return self._frames

    @property
    def regenerated_from(self) -> float:
        return self._regenerated_from

    @property
    def boxes(self) -> list[Box | None]:
        return list(self._boxes)

    @property
    def alpha(self) -> AlphaMasks | None:
        return self._alpha

    def frame(self, frame_index: int, face: np.ndarray | None, copy: bool = True, weight: float = 1.0) -> np.ndarray:
        """One output frame: avatar frame ``frame_index`` in I420, with ``face`` blended into its box.

        Args:
            frame_index: The avatar frame, in ``[0, count)``.
            face: The generated face, BGR ``(y2 - y1, x2 - x1, 3)`` uint8 (exactly the box's size), or
                None to pass the frame through.
            copy: Only for ``face=None``: False returns the cached frame itself, a read-only view the
                caller must not (and cannot) modify, instead of a copy.
            weight: Only with alpha masks: the mask scaled by this (0: the frame passes through).

        Returns:
            A new C-contiguous ``(height * 3 // 2, width)`` uint8 I420 frame (for `Mp4Writer.write_yuv420`);
            with ``face=None, copy=False`` the cached frame itself (read-only).

        Raises:
            IndexError: ``frame_index`` is out of range.
            ValueError: ``face`` is given for a frame without a box, or its shape or dtype is wrong.
        """
        if face is None and not copy:
            self._check_index(frame_index)
            return self._data[frame_index]
        out = np.empty((self._height * 3 // 2, self._width), np.uint8)
        self.frame_into(frame_index, face, split_i420(out, self._height, self._width), weight)
        return out

    def frame_into(
        self,
        frame_index: int,
        face: np.ndarray | None,
        planes: tuple[np.ndarray, np.ndarray, np.ndarray],
        weight: float = 1.0,
    ) -> None:
        """`frame`, written into ``planes``: writable Y (height, width), U and V (height/2, width/2)
        arrays, such as the encoder's own frame (`Mp4Writer.i420_planes`), so an output frame is
        copied once (cached frame -> encoder frame) and blended there. Same arguments and errors."""
        self._check_index(frame_index)
        region = None if face is None else self._face_region(frame_index, face, weight)
        out_y, out_u, out_v = planes
        cached_y, cached_u, cached_v = split_i420(self._data[frame_index], self._height, self._width)
        out_y[:] = cached_y
        out_u[:] = cached_u
        out_v[:] = cached_v
        if region is None:
            return
        face_y, face_u, face_v, weights, (x1, y1, x2, y2), top, left = region
        h = y2 - y1
        w = x2 - x1
        _blend(face_y[top : top + h, left : left + w], out_y[y1:y2, x1:x2], weights.wy, weights.wy_inv)
        cy, cx = (y1 - top) // 2, (x1 - left) // 2  # the expanded region's first chroma block
        rows, cols = weights.rows, weights.cols
        crow = slice(cy + rows.start, cy + rows.stop)
        ccol = slice(cx + cols.start, cx + cols.stop)
        _blend(face_u[rows, cols], out_u[crow, ccol], weights.wc, weights.wc_inv)
        _blend(face_v[rows, cols], out_v[crow, ccol], weights.wc, weights.wc_inv)

    def _check_index(self, frame_index: int) -> None:
        if not 0 <= frame_index < len(self._boxes):
            raise IndexError(f"frame {frame_index} out of range: the avatar has {len(self._boxes)} frames")

    def _face_region(self, frame_index: int, face: np.ndarray, weight: float = 1.0) -> _FaceRegion | None:
        """`face` (validated) made ready to blend into frame ``frame_index`` (None: nothing to blend)."""
        box = self._boxes[frame_index]
        if box is None:
            raise ValueError(f"frame {frame_index} has no face box, but a face was given")
        x1, y1, x2, y2 = box
        h, w = y2 - y1, x2 - x1
        if self._alpha is not None:
            return self._alpha_region(frame_index, face, box, weight)
        if not isinstance(face, np.ndarray) or face.shape != (h, w, 3) or face.dtype != np.uint8:
            raise ValueError(
                f"face is {getattr(face, 'shape', type(face))} {getattr(face, 'dtype', '')}, the box {box} needs {(h, w, 3)} uint8"
            )

        # Only the regenerated region (box rows from `start` on) is blended; above it the frame keeps
        # the cached bytes (Y rows and the chroma blocks whose top-left pixel is above `start`).
        start = regenerated_start(h, self._regenerated_from) if self._regenerated_from > 0 else 0
        if start:
            face = face[start:]
            y1 += start
            h -= start

        face_y, face_u, face_v, (top, left, bottom, right) = _even_planes(face, (x1, y1, x2, y2))
        weights = _weights(h + start, w, top, left, bottom, right, self._feather, self._siting, start)
        return _FaceRegion(face_y, face_u, face_v, weights, (x1, y1, x2, y2), top, left)

    def _alpha_region(self, frame_index: int, face: np.ndarray, box: Box, weight: float) -> _FaceRegion | None:
        """A generated face of any size through the frame's alpha mask (the module docstring), scaled by `weight`."""
        assert self._alpha is not None
        if not isinstance(face, np.ndarray) or face.ndim != 3 or face.shape[2] != 3 or face.dtype != np.uint8:
            raise ValueError(
                f"face is {getattr(face, 'shape', type(face))} {getattr(face, 'dtype', '')}, need (H, W, 3) uint8"
            )
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"weight must be in [0, 1], got {weight}")
        x1, y1, x2, y2 = box
        h, w = y2 - y1, x2 - x1
        alpha = self._alpha.over_box(frame_index, box)
        if weight < 1.0:
            alpha *= np.float32(weight)
        touched = np.flatnonzero(alpha.max(axis=1) > 0)
        if not len(touched):
            return None  # the mask (or the weight) leaves the frame as it is
        start = int(touched[0])
        if face.shape[:2] != (h, w):
            face = cv2.resize(face, (w, h), interpolation=cv2.INTER_LINEAR)
        face, alpha = face[start:], alpha[start:]
        y1 += start
        h -= start
        face_y, face_u, face_v, (top, left, bottom, right) = _even_planes(face, (x1, y1, x2, y2))
        weights = _mask_weights(alpha, top, left, bottom, right, self._siting)
        return _FaceRegion(face_y, face_u, face_v, weights, (x1, y1, x2, y2), top, left)


def _even_planes(face: np.ndarray, box: Box) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int, int, int]]:
    """The face's I420 planes over its box expanded to even coordinates, and that padding (top, left,
    bottom, right): so the face's chroma grid is the frame's (x2/y2 cannot pass the even frame size).
    The padding's content only feeds chroma blocks whose weight there is 0 (top-left siting) or near
    0, so replicating the face's edge is enough."""
    x1, y1, x2, y2 = box
    top, left, bottom, right = y1 & 1, x1 & 1, y2 & 1, x2 & 1
    if top or left or bottom or right:
        padded = cv2.copyMakeBorder(face, top, bottom, left, right, cv2.BORDER_REPLICATE)
    else:
        padded = face if face.flags.c_contiguous else np.ascontiguousarray(face)
    eh, ew = y2 - y1 + top + bottom, x2 - x1 + left + right
    face_y, face_u, face_v = split_i420(cv2.cvtColor(padded, cv2.COLOR_BGR2YUV_I420), eh, ew)
    return face_y, face_u, face_v, (top, left, bottom, right)


@functools.lru_cache(maxsize=64)
def feather_mask(height: int, width: int, feather: float = 0.15) -> np.ndarray:
    """A blending mask that is 1 in the centre and ramps smoothly to 0 at the borders.

    The ramp covers ``feather`` of the height (top and bottom) and of the width (left and right) and
    follows a smoothstep, so a pasted face has no visible seam: its edge pixels take the frame's
    value and the blend has no kink where the ramp starts.

    Args:
        height: Mask height in pixels.
        width: Mask width in pixels.
        feather: Ramp length as a fraction of each dimension, in [0, 0.5]; 0 gives a hard paste.

    Returns:
        A read-only (height, width, 1) float32 array in [0, 1] (cached per arguments, so shared).
    """
    if not 0.0 <= feather <= 0.5:
        raise ValueError(f"feather must be in [0, 0.5], got {feather}")
    mask = np.outer(_ramp(height, feather), _ramp(width, feather)).astype(np.float32)[:, :, None]
    mask.setflags(write=False)  # cached and shared between callers: nobody may modify it
    return mask


def _ramp(size: int, feather: float) -> np.ndarray:
    """1-D profile: 0 at both ends, smoothstep up to 1 over ``feather * size`` pixels."""
    ramp_len = feather * size
    if ramp_len < 1.0:
        return np.ones(size, dtype=np.float64)
    index = np.arange(size, dtype=np.float64)
    distance = np.minimum(index, size - 1 - index)  # pixels from the nearest edge
    t = np.clip(distance / ramp_len, 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)
