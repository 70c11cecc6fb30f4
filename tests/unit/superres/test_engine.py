"""SuperResEngine (device-side batch maths) against the per-crop CPU path in process.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from services.inference.checkpoints import seeded_state_dict
from services.media.packed import PackedImages
from services.superres.engine import SuperResEngine, UpscaleChunk
from services.superres.models import RRDBNet, SRVGGNetCompact
from services.superres.upscaler import LanczosUpscaler, ModelUpscaler


def _srvgg(scale: float = 0.05) -> SRVGGNetCompact:
    model = SRVGGNetCompact(num_conv=3)
    model.load_state_dict(seeded_state_dict(model, scale=scale))
    return model.eval()


def _crop(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _expected(
    upscaler: ModelUpscaler | LanczosUpscaler, crops: list[np.ndarray], sizes: list[tuple[int, int]]
) -> list[np.ndarray]:
    """The CPU reference: one upscaler call per item (cv2 LANCZOS4 on the host)."""
    return [upscaler.upscale(c[None], [s])[0] for c, s in zip(crops, sizes)]


def _assert_close(
    got: list[np.ndarray], expected: list[np.ndarray], max_diff: int = 1, max_changed: float = 1e-3
) -> None:
    assert [g.shape for g in got] == [e.shape for e in expected]
    diffs = [np.abs(g.astype(int) - e) for g, e in zip(got, expected)]
    assert max(d.max() for d in diffs) <= max_diff
    assert np.mean([(d > 0).mean() for d in diffs]) < max_changed  # same maths: (nearly) bit-exact


def _assert_same_chunks(got: list[PackedImages], want: list[PackedImages], exact: bool) -> None:
    """Chunk by chunk: same sizes; bytes identical (`exact`) or within one level on a few pixels.

    Why not always exact on CUDA: cuBLAS (the Lanczos matrix products) and cuDNN promise bit-wise
    reproducible results only while a single stream is active; with concurrent streams they may pick
    other kernels, whose float rounding can move a pixel across a .5 boundary (measured on an H200:
    at most 2 levels apart on up to 1.2% of the pixels, fp16 network; a race on a shared buffer would
    put other crops' pixels, many levels off, into whole images).
    """
    assert [(c.widths, c.heights) for c in got] == [(c.widths, c.heights) for c in want]
    for g, w in zip(got, want):
        if exact:
            assert g.data == w.data
        else:
            _assert_close(g.arrays(), w.arrays(), max_diff=2, max_changed=0.05)


def _two_chunks() -> tuple[list[np.ndarray], list[tuple[int, int]], list[np.ndarray], list[tuple[int, int]]]:
    # Chunk a mixes two input sizes and repeats an output size; chunk b shares a's main input size.
    crops_a = [_crop(24, 20, 1), _crop(17, 23, 2), _crop(24, 20, 3), _crop(24, 20, 4), _crop(17, 23, 5)]
    sizes_a = [(80, 96), (92, 68), (50, 60), (80, 96), (130, 70)]
    crops_b = [_crop(24, 20, 6), _crop(24, 20, 7)]
    sizes_b = [(33, 47), (80, 96)]
    return crops_a, sizes_a, crops_b, sizes_b


RESIZES = ["torch", "cv2"]  # the GPU's resize (matrix products), and the CPU default (cv2 per item)


@pytest.mark.parametrize("resize", RESIZES)
@pytest.mark.parametrize("max_batch", [None, 2])
def test_model_engine_matches_cpu_path_across_chunks(max_batch: int | None, resize: str) -> None:
    upscaler = ModelUpscaler(_srvgg(), scale=4)
    engine = SuperResEngine(upscaler, max_batch=max_batch, resize=resize)
    crops_a, sizes_a, crops_b, sizes_b = _two_chunks()
    out_a, out_b = engine.run([UpscaleChunk.from_items(crops_a, sizes_a), UpscaleChunk.from_items(crops_b, sizes_b)])
    assert isinstance(out_a, PackedImages) and isinstance(out_a.data, bytes)
    assert out_a.widths == [w for w, _ in sizes_a] and out_a.heights == [h for _, h in sizes_a]
    _assert_close(out_a.arrays(), _expected(upscaler, crops_a, sizes_a))
    _assert_close(out_b.arrays(), _expected(upscaler, crops_b, sizes_b))


def test_native_size_needs_no_resize_and_is_exact() -> None:
    upscaler = ModelUpscaler(_srvgg(), scale=4)
    crops = [_crop(12, 10, s) for s in range(3)]
    (out,) = SuperResEngine(upscaler).run([UpscaleChunk.from_items(crops, [(40, 48)] * 3)])
    expected = upscaler.upscale(np.stack(crops), (40, 48))
    assert all(np.array_equal(g, e) for g, e in zip(out.arrays(), expected))


def test_channels_last_layout_gives_the_same_result() -> None:
    """The CUDA layout (channels_last), exercised on the CPU."""
    model = _srvgg()
    crops_a, sizes_a, _, _ = _two_chunks()
    reference = ModelUpscaler(copy.deepcopy(model), scale=4)
    engine = SuperResEngine(ModelUpscaler(model, scale=4), channels_last=True, resize="torch")
    (out,) = engine.run([UpscaleChunk.from_items(crops_a, sizes_a)])
    _assert_close(out.arrays(), _expected(reference, crops_a, sizes_a))


@pytest.mark.parametrize("resize", RESIZES)
@pytest.mark.parametrize("scale", [2, 1])
def test_rrdb_odd_sizes_are_padded_like_process(scale: int, resize: str) -> None:
    model = RRDBNet(scale=scale, num_block=1, num_feat=16, num_grow_ch=8)
    model.load_state_dict(seeded_state_dict(model, scale=0.05))
    upscaler = ModelUpscaler(model.eval(), scale=scale)
    crops = [_crop(7, 9, 1), _crop(7, 9, 2)]
    sizes = [(9 * scale, 7 * scale), (31, 29)]
    (out,) = SuperResEngine(upscaler, resize=resize).run([UpscaleChunk.from_items(crops, sizes)])
    _assert_close(out.arrays(), _expected(upscaler, crops, sizes))


@pytest.mark.parametrize("resize", RESIZES)
def test_colour_order_blue_stays_blue(resize: str) -> None:
    model = SRVGGNetCompact(num_conv=2)
    model.load_state_dict(seeded_state_dict(model))
    with torch.no_grad():  # zero residual: the output is the nearest x4 upsample of the input
        model.body[-1].weight.zero_()
        model.body[-1].bias.zero_()
    crop = np.zeros((8, 8, 3), np.uint8)
    crop[..., 0] = 255  # pure blue in BGR
    engine = SuperResEngine(ModelUpscaler(model.eval(), scale=4), resize=resize)
    out_native, out_resized = engine.run(
        [UpscaleChunk.from_items([crop], [(32, 32)]), UpscaleChunk.from_items([crop], [(50, 40)])]
    )
    for img in (*out_native.arrays(), *out_resized.arrays()):
        assert (img[..., 0] == 255).all() and (img[..., 1:] == 0).all()


@pytest.mark.parametrize("resize", RESIZES)
def test_lanczos_fallback_matches_cv2(resize: str) -> None:
    upscaler = LanczosUpscaler()
    engine = SuperResEngine(upscaler, resize=resize)
    assert engine.model_name == "lanczos" and engine.device.type == "cpu"
    crops_a, sizes_a, crops_b, sizes_b = _two_chunks()
    sizes_b = [(20, 24), (160, 192)]  # an unchanged size comes back as the crop itself
    out_a, out_b = engine.run([UpscaleChunk.from_items(crops_a, sizes_a), UpscaleChunk.from_items(crops_b, sizes_b)])
    _assert_close(out_a.arrays(), _expected(upscaler, crops_a, sizes_a))
    _assert_close(out_b.arrays(), _expected(upscaler, crops_b, sizes_b))
    assert np.array_equal(out_b.arrays()[0], crops_b[0])


def test_warmup_and_empty_batches() -> None:
    engine = SuperResEngine(ModelUpscaler(_srvgg(), scale=4))
    engine.warmup()
    SuperResEngine(LanczosUpscaler()).warmup(batch_size=2)
    assert engine.run([]) == []
    assert engine.run([UpscaleChunk.from_items([], [])]) == [PackedImages([], [], b"")]


def test_chunk_grouping_and_validation() -> None:
    chunk = UpscaleChunk.from_items([_crop(4, 5, 0), _crop(6, 5, 1), _crop(4, 5, 2)], [(8, 8), (9, 9), (10, 10)])
    assert len(chunk) == 3
    assert [(p.tolist(), [c.shape for c in cs]) for p, cs in chunk.groups] == [
        ([0, 2], [(4, 5, 3)] * 2),
        ([1], [(6, 5, 3)]),
    ]
    with pytest.raises(ValueError, match="output sizes"):
        UpscaleChunk.from_items([_crop(4, 5, 0)], [(8, 8), (9, 9)])
    with pytest.raises(ValueError, match="positive"):
        UpscaleChunk.from_items([_crop(4, 5, 0)], [(0, 8)])
    with pytest.raises(ValueError, match="uint8"):
        UpscaleChunk.from_items([np.zeros((4, 5, 3), np.float32)], [(8, 8)])


def test_model_device_must_match() -> None:
    upscaler = ModelUpscaler(_srvgg(), scale=4)
    with pytest.raises(ValueError, match="lives on"):
        SuperResEngine(upscaler, "meta")
    assert SuperResEngine(upscaler, "cpu").device.type == "cpu"
    assert SuperResEngine(upscaler).resize == "cv2"  # the CPU default
    with pytest.raises(ValueError, match="resize"):
        SuperResEngine(upscaler, resize="pillow")


def test_backend_path_matches_direct_model() -> None:
    """The service runs the network through a Backend (buckets pad the batch): same images as direct."""
    from services.inference.backends import make_backend

    crops_a, sizes_a, crops_b, sizes_b = _two_chunks()
    chunks = [UpscaleChunk.from_items(crops_a, sizes_a), UpscaleChunk.from_items(crops_b, sizes_b)]
    model = _srvgg()
    direct = SuperResEngine(ModelUpscaler(copy.deepcopy(model), 4)).run(chunks)
    upscaler = ModelUpscaler(copy.deepcopy(model), 4)
    backend = make_backend("torch", upscaler.model, "cpu", precision="fp32", batch_buckets=(8,))
    via_backend = SuperResEngine(upscaler, backend=backend).run(chunks)
    for a, b in zip(direct, via_backend):
        assert (a.widths, a.heights) == (b.widths, b.heights)
        _assert_close(a.arrays(), b.arrays())


@pytest.mark.gpu
def test_engine_on_cuda_matches_cpu() -> None:
    """The service's CUDA path (fp16, channels_last) and a strict-fp32 CUDA run against the CPU engine."""
    from services.inference.backends import strict_fp32

    crops = [_crop(96, 96, s) for s in range(40)] + [_crop(80, 72, s) for s in range(5)]
    sizes = [(150, 170)] * 20 + [(384, 384)] * 10 + [(90, 100)] * 10 + [(200, 220)] * 5

    def run(device: str, dtype: torch.dtype) -> np.ndarray:
        upscaler = ModelUpscaler(_srvgg(), scale=4, device=device, dtype=dtype)
        (out,) = SuperResEngine(upscaler, max_batch=16).run([UpscaleChunk.from_items(crops, sizes)])
        return np.concatenate([a.reshape(-1) for a in out.arrays()]).astype(int)

    cpu = run("cpu", torch.float32)
    with strict_fp32():
        fp32 = run("cuda", torch.float32)
    fp16 = run("cuda", torch.float16)
    assert np.abs(fp32 - cpu).max() <= 2
    assert np.abs(fp16 - cpu).mean() < 1.0 and np.abs(fp16 - cpu).max() <= 8
    lanczos = SuperResEngine(LanczosUpscaler(), "cuda").run([UpscaleChunk.from_items(crops, sizes)])[0]
    expected = _expected(LanczosUpscaler(), crops, sizes)
    assert max(np.abs(g.astype(int) - e).max() for g, e in zip(lanczos.arrays(), expected)) <= 1


def _concurrent_runs_match_serial(device: str, resize: str | None = None) -> None:
    """Batches run from several threads at once (the service's pipeline_depth) give the serial results."""
    from concurrent.futures import ThreadPoolExecutor

    from services.inference.backends import make_backend

    upscaler = ModelUpscaler(_srvgg(), scale=4, device=device)
    backend = make_backend("auto", upscaler.model, device, max_batch=16)
    engine = SuperResEngine(upscaler, max_batch=16, resize=resize, backend=backend, overlap=True)
    engine.warmup(16)  # captures the CUDA graph of the bucket first, as the service does, on one thread
    crops_a, sizes_a, crops_b, sizes_b = _two_chunks()
    batches = [
        [UpscaleChunk.from_items(crops_a, sizes_a)],
        [UpscaleChunk.from_items(crops_b, sizes_b), UpscaleChunk.from_items(crops_a[:2], sizes_a[:2])],
        [UpscaleChunk.from_items([_crop(24, 20, s) for s in range(20)], [(60 + s, 70) for s in range(20)])],
    ]
    serial = [engine.run(b) for b in batches]
    with ThreadPoolExecutor(3) as pool:
        for _ in range(3):
            for want, got in zip(serial, pool.map(engine.run, batches)):
                _assert_same_chunks(got, want, exact=device == "cpu")


@pytest.mark.parametrize("resize", RESIZES)
def test_concurrent_runs_match_serial_cpu(resize: str) -> None:
    """On the CPU, overlap is off: a lock runs one batch at a time, whatever the callers' threads."""
    _concurrent_runs_match_serial("cpu", resize)


def test_overlap_is_off_on_the_cpu() -> None:
    engine = SuperResEngine(ModelUpscaler(_srvgg(), scale=4), overlap=True)
    assert not engine.streams.enabled


@pytest.mark.gpu
def test_concurrent_runs_match_serial_cuda() -> None:
    """Per-thread I/O streams + one compute stream with CUDA graphs: no race on the static buffers."""
    _concurrent_runs_match_serial("cuda")


@pytest.mark.gpu
def test_overlap_matches_serial_engine_cuda() -> None:
    """Depth 2 (overlap, concurrent callers) gives the bytes of depth 1 (no overlap, one caller)."""
    from concurrent.futures import ThreadPoolExecutor

    crops = [_crop(96, 96, s) for s in range(48)]
    chunks = [
        UpscaleChunk.from_items(crops[k : k + 8], [(150 + k, 170)] * 4 + [(384, 384)] * 4) for k in range(0, 48, 8)
    ]
    model = _srvgg()
    plain = SuperResEngine(ModelUpscaler(copy.deepcopy(model), scale=4, device="cuda"), max_batch=16)
    overlap = SuperResEngine(ModelUpscaler(copy.deepcopy(model), scale=4, device="cuda"), max_batch=16, overlap=True)
    want = [plain.run([c])[0] for c in chunks]
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda c: overlap.run([c])[0], chunks))
    _assert_same_chunks(got, want, exact=False)
