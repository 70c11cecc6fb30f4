"""OpenCV's INTER_LANCZOS4 resize as two matrix products, on any torch device.

`cv2.resize(img, (w, h), interpolation=cv2.INTER_LANCZOS4)` is separable: every output column is a
fixed 8-tap combination of input columns, and every output row of input rows. So the resize of a
(B, C, H, W) batch is `Wy @ x @ Wx.T` with a (out_h, H) and a (out_w, W) weight matrix (mostly zeros,
8 non-zeros a row). On a GPU that is two batched GEMMs for a whole batch of crops; on the CPU it is
what the unit tests run.

The matrices follow OpenCV 4.x `cv::hal::resize` (imgproc/src/resize.cpp) step by step, with its
float32/float64 mix, so the taps agree to the last bit:

* source position of output pixel d: `fx = float((d + 0.5) * scale - 0.5)` with
  `scale = 1 / (out / in)` in double; taps `floor(fx) - 3 .. floor(fx) + 4`, phase `fx - floor(fx)`;
* weights `interpolateLanczos4`: sin(pi t) sin(pi t / 4) / (pi^2 t^2 / 4) (Lanczos, a = 4) for the
  8 tap distances t, computed with the angle-addition table OpenCV uses, normalised to sum 1
  (a tap at distance exactly 0 gets 1e30 before normalising, i.e. weight 1);
* no antialiasing when shrinking: the same 8 taps whatever the scale;
* borders: a tap outside the image takes the nearest edge pixel (BORDER_REPLICATE). OpenCV's
  generic resize clamps the row index (`clip(sy, 0, H)`) and walks column indices back inside
  (`HResizeLanczos4`), i.e. replicate, not BORDER_REFLECT_101; measured against cv2 4.14, see
  tests/unit/superres/test_lanczos.py;
* uint8 images use fixed point in OpenCV: each weight is rounded to a multiple of 1/2048
  (`saturate_cast<short>(w * 2048)`), the two passes are exact integer sums and the result is
  `(v + 2^21) >> 22`, i.e. round half up. `fixed_point=True` uses the same rounded weights, so
  that `floor(lanczos4_resize(x, size, fixed_point=True) + 0.5).clamp(0, 255)` of a uint8-valued
  float image reproduces cv2's uint8 output: bit-exact in most test cases, otherwise one level off
  on at most ~2e-5 of the values (float32 sums in the second pass land on the other side of a
  rounding tie). With `fixed_point=False` (OpenCV's float path) results differ from cv2's uint8
  output by at most one level (on 3-25% of the values).

Precision: the matrices are float64 on the host, cast to the input's dtype. Use float32 inputs
(values up to 255 need more mantissa than float16 has). On CUDA keep cuBLAS at true fp32 (torch's
default `torch.backends.cuda.matmul` precision "ieee"): TF32 keeps 10 mantissa bits, i.e. errors
of ~0.1 level per product on values near 255, which would lose the bit-exact match (not measured).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

__all__ = ["lanczos4_matrix", "lanczos4_resize", "round_like_opencv"]

_COEF_SCALE = 2048  # OpenCV INTER_RESIZE_COEF_SCALE (1 << INTER_RESIZE_COEF_BITS, 11 bits)
_S45 = 0.70710678118654752440084436210485
# cos/sin of the tap-to-tap angle step (-pi/4 * i), OpenCV's `cs` table.
_CS = ((1, 0), (-_S45, -_S45), (0, 1), (_S45, -_S45), (-1, 0), (_S45, _S45), (0, -1), (-_S45, _S45))


def _lanczos4_taps(fx: np.ndarray) -> np.ndarray:
    """OpenCV `interpolateLanczos4` for float32 phases fx (n,) in [0, 1): (n, 8) float32 weights.

    Vectorised over n but with OpenCV's operation order and float32/float64 casts.
    """
    f32 = np.float32
    x3 = (fx + f32(3)).astype(f32)  # `x+3` is float arithmetic in C
    y0 = -x3.astype(np.float64) * math.pi * 0.25
    s0, c0 = np.sin(y0), np.cos(y0)
    coeffs = np.empty((len(fx), 8), f32)
    total = np.zeros(len(fx), f32)
    for i in range(8):
        t = (x3 - f32(i)).astype(f32)
        y = -t.astype(np.float64) * math.pi * 0.25
        with np.errstate(divide="ignore", invalid="ignore"):
            c = ((_CS[i][0] * s0 + _CS[i][1] * c0) / (y * y)).astype(f32)
        coeffs[:, i] = np.where(np.abs(t) >= f32(1e-6), c, f32(1e30))  # the tap on the sample: weight 1
        total = (total + coeffs[:, i]).astype(f32)
    inv = (f32(1) / total).astype(f32)
    return (coeffs * inv[:, None]).astype(f32)


@functools.lru_cache(maxsize=64)
def _matrix_np(in_size: int, out_size: int, fixed_point: bool) -> np.ndarray:
    if in_size <= 0 or out_size <= 0:
        raise ValueError(f"sizes must be positive, got {in_size} -> {out_size}")
    scale = 1.0 / (out_size / in_size)  # OpenCV: scale_x = 1. / inv_scale_x, inv = dsize / ssize
    fx = ((np.arange(out_size, dtype=np.float64) + 0.5) * scale - 0.5).astype(np.float32)
    sx = np.floor(fx)
    fx = (fx - sx.astype(np.float32)).astype(np.float32)
    w = _lanczos4_taps(fx)
    if fixed_point:
        # saturate_cast<short>(float): round to nearest, ties to even (cvRound).
        w = np.clip(np.rint(w * np.float32(_COEF_SCALE)), -32768, 32767) / _COEF_SCALE
    cols = np.clip(sx.astype(np.int64)[:, None] - 3 + np.arange(8), 0, in_size - 1)  # replicate border
    m = np.zeros((out_size, in_size), np.float64)
    np.add.at(m, (np.repeat(np.arange(out_size), 8), cols.reshape(-1)), w.astype(np.float64).reshape(-1))
    m.setflags(write=False)
    return m


def lanczos4_matrix(in_size: int, out_size: int, fixed_point: bool = False) -> np.ndarray:
    """The (out_size, in_size) float64 weight matrix of one axis (read-only, cached)."""
    return _matrix_np(int(in_size), int(out_size), bool(fixed_point))


# Paste sizes vary from frame to frame: keep plenty of device matrices (a 384 -> 400 one is 0.6 MB
# in float32; the 2,048 px cap bounds one at 16 MB). A miss costs ~0.1 ms of numpy and one upload.
@functools.lru_cache(maxsize=512)
def _cached_matrix(
    in_size: int, out_size: int, fixed_point: bool, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """The device matrix and, on CUDA, an event recorded after its upload on the current stream."""
    host = torch.from_numpy(_matrix_np(in_size, out_size, fixed_point).copy())
    if device.type == "cuda":  # through pinned memory: a pageable upload would wait for the stream
        matrix = host.pin_memory().to(device, non_blocking=True).to(dtype)
        uploaded = torch.cuda.Event()
        uploaded.record(torch.cuda.current_stream(device))
        return matrix, uploaded
    return host.to(device=device, dtype=dtype), None


def _matrix(in_size: int, out_size: int, fixed_point: bool, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A cached device matrix, safe to use on the current CUDA stream whichever stream uploaded it.

    Callers on several threads may each run on their own stream (the superres engine's overlap):
    the current stream waits for the upload, and the matrix is marked as used on it, so that once
    evicted from the cache its memory is not reused before this stream's kernels have read it.
    """
    matrix, uploaded = _cached_matrix(in_size, out_size, fixed_point, device, dtype)
    if uploaded is not None:
        stream = torch.cuda.current_stream(matrix.device)
        stream.wait_event(uploaded)
        matrix.record_stream(stream)
    return matrix


def lanczos4_resize(x: torch.Tensor, size: tuple[int, int], *, fixed_point: bool = False) -> torch.Tensor:
    """Resize (B, C, H, W) (or (C, H, W), (H, W)) float images to `size` = (out_h, out_w), like cv2 LANCZOS4.

    Args:
        x: floating-point images on any device; the last two dims are H and W.
        size: (out_h, out_w). Note: (height, width), torch order, not cv2's (width, height).
        fixed_point: use OpenCV's uint8 weights (multiples of 1/2048); see the module docstring.

    Returns:
        A new tensor (B, C, out_h, out_w) of x's dtype on x's device, not rounded or clamped
        (Lanczos over/undershoots near edges: clamp before casting to an integer type). When the
        size is unchanged, `x` itself is returned (cv2 copies).
    """
    if not x.is_floating_point():
        raise TypeError(f"lanczos4_resize needs a floating-point tensor, got {x.dtype}")
    if x.dim() < 2:
        raise ValueError(f"expected (..., H, W), got shape {tuple(x.shape)}")
    out_h, out_w = int(size[0]), int(size[1])
    h, w = x.shape[-2:]
    if (out_h, out_w) == (h, w):
        return x
    wy = _matrix(h, out_h, fixed_point, x.device, x.dtype)  # (out_h, H)
    wx = _matrix(w, out_w, fixed_point, x.device, x.dtype)  # (out_w, W)
    # Cheaper order first: columns then rows costs H*W*ow + oh*H*ow multiply-adds, the other way
    # oh*H*W + oh*W*ow. OpenCV goes columns first; with the fixed-point weights both orders keep
    # the first pass exact, so the choice only moves float32 rounding in the last bits.
    if h * w * out_w + out_h * h * out_w <= out_h * h * w + out_h * w * out_w:
        return torch.matmul(wy, torch.matmul(x, wx.T))
    return torch.matmul(torch.matmul(wy, x), wx.T)


def round_like_opencv(x: torch.Tensor) -> torch.Tensor:
    """float -> uint8 the way OpenCV's fixed-point resize stores a pixel: round half up, saturate."""
    return (x + 0.5).floor_().clamp_(0, 255).to(torch.uint8)
