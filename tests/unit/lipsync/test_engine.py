"""LipSyncEngine (device-side batch maths) against the upstream-exact numpy path in prep.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.inference.backends import make_backend
from services.inference.checkpoints import seeded_state_dict
from services.lipsync import prep
from services.lipsync.engine import CropBank, GenerateChunk, LipSyncEngine
from services.lipsync.wav2lip import Wav2Lip
from services.serving.errors import InvalidRequest, TooLarge


@pytest.fixture(scope="module")
def model() -> Wav2Lip:
    m = Wav2Lip()
    m.load_state_dict(seeded_state_dict(m, scale=0.035))
    return m.eval()


def _inputs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    faces = rng.integers(0, 256, (n, 96, 96, 3), dtype=np.uint8)
    mels = (rng.random((n, 80, 16)) * 8 - 4).astype(np.float16)
    return faces, mels


def _numpy_path(model: Wav2Lip, faces: np.ndarray, mels: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        pred = model(
            torch.from_numpy(prep.mel_inputs(mels.astype(np.float32))), torch.from_numpy(prep.model_inputs(faces))
        )
    return prep.to_uint8_faces(pred.numpy())


def test_engine_matches_numpy_path_across_chunks_and_banks(model: Wav2Lip) -> None:
    engine = LipSyncEngine(make_backend("cpu", model, "cpu"))
    faces_a, mels_a = _inputs(3, 1)
    faces_b, mels_b = _inputs(2, 2)
    bank_a, bank_b = engine.new_bank(8), engine.new_bank(8)
    for i, f in enumerate(faces_a):
        bank_a.add(10 + i, f)
    for i, f in enumerate(faces_b):
        bank_b.add(i, f)
    # Items name crops out of order and twice; two streams' chunks share one batch.
    order_a = np.array([12, 10, 10])
    chunk_a = GenerateChunk(bank_a, bank_a.rows(order_a, np.arange(3)), mels_a, None)
    chunk_b = GenerateChunk(bank_b, bank_b.rows(np.array([1, 0]), np.arange(2)), mels_b, None)
    out_a, out_b = engine.run([chunk_a, chunk_b])
    expected_a = _numpy_path(model, faces_a[order_a - 10], mels_a)
    expected_b = _numpy_path(model, faces_b[[1, 0]], mels_b)
    got_a = np.stack(out_a.arrays())
    got_b = np.stack(out_b.arrays())
    # Same maths in the same precision: at most one level apart (summation order of the batch).
    assert np.abs(got_a.astype(int) - expected_a).max() <= 1
    assert np.abs(got_b.astype(int) - expected_b).max() <= 1
    assert (got_a == expected_a).mean() > 0.99


def test_engine_resizes_like_cv2_inter_linear(model: Wav2Lip) -> None:
    engine = LipSyncEngine(make_backend("cpu", model, "cpu"))
    faces, mels = _inputs(4, 3)
    bank = engine.new_bank(4)
    for i, face in enumerate(faces):
        bank.add(i, face)
    # One upscale, one downscale and the model's own size, interleaved over two chunks: the engine
    # resizes per size (out of item order) and must hand every face back in its item's place.
    sizes = [(150, 170), (64, 80), (150, 170), (96, 96)]
    out_a, out_b = engine.run(
        [
            GenerateChunk(bank, np.array([0, 1, 2]), mels[:3], sizes[:3]),
            GenerateChunk(bank, np.array([3]), mels[3:], sizes[3:]),
        ]
    )
    raw = _numpy_path(model, faces, mels)
    assert list(zip(out_a.widths + out_b.widths, out_a.heights + out_b.heights)) == sizes
    for face, (w, h), r in zip(out_a.arrays() + out_b.arrays(), sizes, raw):
        assert face.shape == (h, w, 3)
        expected = prep.resize_to(r, w, h)
        # Bilinear on the GPU vs OpenCV's fixed-point INTER_LINEAR: a level or two of rounding.
        assert np.abs(face.astype(int) - expected).max() <= 2


def test_crop_bank_validates() -> None:
    bank = LipSyncEngine(make_backend("cpu", torch.nn.Identity(), "cpu")).new_bank(max_crops=1)
    with pytest.raises(InvalidRequest, match="send 96x96"):
        bank.add(0, np.zeros((32, 32, 3), np.uint8))
    bank.add(0, np.zeros((96, 96, 3), np.uint8))
    bank.add(0, np.ones((96, 96, 3), np.uint8))  # replacing an index is not a new crop
    assert len(bank) == 1 and int(bank.tensor()[0].max()) == 1
    with pytest.raises(TooLarge, match="more than 1 reference crops"):
        bank.add(1, np.zeros((96, 96, 3), np.uint8))
    with pytest.raises(InvalidRequest, match="frame 7 names crop 5"):
        bank.rows(np.array([0, 5]), np.array([6, 7]))


def _concurrent_runs_match_serial(device: str, model: Wav2Lip) -> None:
    """Batches run from several threads at once (the batcher's concurrency) give the serial results."""
    import copy
    from concurrent.futures import ThreadPoolExecutor

    engine = LipSyncEngine(make_backend("auto", copy.deepcopy(model), device, max_batch=16), overlap=True)
    faces, mels = _inputs(12, 5)
    bank = engine.new_bank(16)
    for i, f in enumerate(faces):
        bank.add(i, f)
    chunks = [GenerateChunk(bank, np.arange(k, k + 4), mels[k : k + 4], [(100 + k, 90)] * 4) for k in (0, 4, 8)]
    serial = [engine.run([c])[0] for c in chunks]
    with ThreadPoolExecutor(3) as pool:
        for _ in range(3):
            parallel = list(pool.map(lambda c: engine.run([c])[0], chunks))
            for a, b in zip(serial, parallel):
                assert (a.widths, a.heights) == (b.widths, b.heights) and a.data == b.data


def test_concurrent_runs_match_serial_cpu(model: Wav2Lip) -> None:
    _concurrent_runs_match_serial("cpu", model)


@pytest.mark.gpu
def test_concurrent_runs_match_serial_cuda(model: Wav2Lip) -> None:
    """Per-thread I/O streams + one compute stream with CUDA graphs: no race on the static buffers."""
    _concurrent_runs_match_serial("cuda", model)


@pytest.mark.gpu
def test_engine_on_cuda_matches_cpu(model: Wav2Lip) -> None:
    """The service's GPU path (auto: fp16, folded BN, CUDA graphs) against the CPU fp32 engine."""
    import copy

    faces, mels = _inputs(40, 4)
    results = []
    for backend in (
        make_backend("cpu", copy.deepcopy(model), "cpu"),
        make_backend("auto", copy.deepcopy(model), "cuda", max_batch=64),
    ):
        engine = LipSyncEngine(backend)
        bank = engine.new_bank(64)
        for i, f in enumerate(faces):
            bank.add(i, f)
        (out,) = engine.run([GenerateChunk(bank, np.arange(40), mels, [(120, 130)] * 40)])
        results.append(np.stack(out.arrays()).astype(int))
    cpu, gpu = results
    assert np.abs(cpu - gpu).mean() < 1.0 and np.abs(cpu - gpu).max() <= 8


def test_a_crop_sent_again_replaces_the_one_the_model_has_read() -> None:
    """A live worker's face link re-sends a crop index (a session took over a freed index) after the model
    thread has read the bank inside inference_mode: the replacement lands (it once raised "Inplace update
    to inference tensor outside InferenceMode", failing the whole Generate stream)."""
    bank = CropBank(torch.device("cpu"), max_crops=4)
    first, second = (np.full((96, 96, 3), v, np.uint8) for v in (10, 200))
    bank.add(0, first)
    bank.add(1, first)
    with torch.inference_mode():  # what the model thread does with it
        assert int(bank.tensor()[0].max()) == 10
    bank.add(0, second)
    with torch.inference_mode():
        rows = bank.tensor()
        assert int(rows[0].min()) == 200 and int(rows[1].max()) == 10
