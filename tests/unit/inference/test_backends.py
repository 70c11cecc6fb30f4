"""Backends and BatchNorm folding: the one decision (resolve_backend_spec), numerics, bucket padding,
the factory, the compile cache key.

Everything here runs on the CPU (CUDA graphs are ignored there, so the padding/chunking logic is
the same code the GPU runs); the GPU-only checks are marked `gpu` and skipped without CUDA.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from services.inference.backends import (
    DEFAULT_BUCKETS,
    Backend,
    CompiledBackend,
    TensorRTBackend,
    TorchBackend,
    auto_kind,
    bucket_for,
    build_backend,
    compile_mode_allows_graphs,
    default_buckets,
    export_onnx,
    make_backend,
    numerics_check,
    reference_output,
    relative_error,
    resolve_backend_spec,
)
from services.inference.backends import spec as spec_module
from services.inference.checkpoints import seeded_state_dict
from services.inference.folding import count_foldable, fold_conv_bn
from services.lipsync.wav2lip import Wav2Lip


def _wav2lip_inputs(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(batch)
    return torch.rand(batch, 1, 80, 16, generator=gen) * 8 - 4, torch.rand(batch, 6, 96, 96, generator=gen)


@pytest.fixture(scope="module")
def wav2lip() -> Wav2Lip:
    model = Wav2Lip()
    model.load_state_dict(seeded_state_dict(model))
    return model.eval()


def _randomise_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm2d clearly non-trivial statistics and affine parameters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.5)
                m.running_var.copy_(torch.rand(n, generator=gen) * 2 + 0.1)
                if m.affine:
                    m.weight.copy_(torch.randn(n, generator=gen))
                    m.bias.copy_(torch.randn(n, generator=gen) * 0.3)
    return model.eval()


class _Tiny(nn.Module):
    """Conv/BN, ConvTranspose/BN (also grouped) in Sequentials, two inputs like Wav2Lip."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.BatchNorm2d(8), nn.ReLU())
        self.b = nn.Sequential(nn.ConvTranspose2d(8, 6, 3, 2, 1, output_padding=1), nn.BatchNorm2d(6), nn.ReLU())
        self.c = nn.Sequential(nn.ConvTranspose2d(6, 4, 3, 1, 1, groups=2, bias=False), nn.BatchNorm2d(4))
        self.d = nn.Sequential(nn.Conv2d(1, 4, 3, 2, 1, bias=False), nn.BatchNorm2d(4, affine=False))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.a(x))) + nn.functional.interpolate(self.d(y), scale_factor=4)


def _tiny_inputs(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + batch)
    return torch.randn(batch, 3, 8, 8, generator=gen), torch.randn(batch, 1, 8, 8, generator=gen)


@pytest.fixture()
def tiny() -> _Tiny:
    torch.manual_seed(0)
    return _randomise_bn(_Tiny())


# --------------------------------------------------------------------------------------------------
# folding
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fold_wav2lip_matches_and_leaves_original_untouched(wav2lip: Wav2Lip) -> None:
    before = {k: v.clone() for k, v in wav2lip.state_dict().items()}
    folded = fold_conv_bn(wav2lip)
    assert count_foldable(wav2lip) == 50  # every conv_block of the generator
    assert count_foldable(folded) == 0
    assert not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
    assert sum(isinstance(m, nn.BatchNorm2d) for m in wav2lip.modules()) == 50
    after = wav2lip.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    inputs = _wav2lip_inputs(2)
    with torch.inference_mode():
        ref, out = wav2lip(*inputs), folded(*inputs)
    assert relative_error(out, ref) < 1e-4


def test_fold_with_nontrivial_statistics_on_wav2lip_encoder(wav2lip: Wav2Lip) -> None:
    # The seeded BNs are near identity; randomised statistics make the fold do real work.
    encoder = _randomise_bn(copy.deepcopy(wav2lip.audio_encoder))
    mel = _wav2lip_inputs(2)[0]
    with torch.inference_mode():
        ref, out = encoder(mel), fold_conv_bn(encoder)(mel)
    assert relative_error(out, ref) < 1e-4


def test_fold_conv_transpose_grouped_and_bias_free(tiny: _Tiny) -> None:
    assert count_foldable(tiny) == 4
    folded = fold_conv_bn(tiny)
    assert isinstance(folded.b[1], nn.Identity) and isinstance(folded.c[1], nn.Identity)
    assert folded.c[0].bias is not None and tiny.c[0].bias is None  # created on the copy only
    with torch.inference_mode():
        ref, out = tiny(*_tiny_inputs(3)), folded(*_tiny_inputs(3))
    assert relative_error(out, ref) < 1e-5
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)


def test_fold_skips_training_only_batchnorm() -> None:
    seq = nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2, track_running_stats=False))
    assert count_foldable(seq) == 0
    assert isinstance(fold_conv_bn(seq)[1], nn.BatchNorm2d)


def test_fold_uses_eval_statistics_even_from_a_training_module(tiny: _Tiny) -> None:
    tiny.train()
    folded = fold_conv_bn(tiny)
    assert tiny.training and not folded.training
    with torch.inference_mode():
        ref = tiny.eval()(*_tiny_inputs(2))
        assert relative_error(folded(*_tiny_inputs(2)), ref) < 1e-5


# --------------------------------------------------------------------------------------------------
# TorchBackend
# --------------------------------------------------------------------------------------------------


def test_default_backend_keeps_cpu_behaviour(tiny: _Tiny) -> None:
    backend = make_backend("cpu", copy.deepcopy(tiny), torch.device("cpu"))
    assert isinstance(backend, TorchBackend) and isinstance(backend, Backend)
    assert (backend.name, backend.precision, backend.device.type) == ("cpu", "fp32", "cpu")
    assert not backend.channels_last and not backend.fold_bn and backend.batch_buckets == ()
    inputs = _tiny_inputs(3)
    out = backend(*inputs)
    with torch.inference_mode():
        assert torch.equal(out, tiny(*inputs))
    assert out.dtype == torch.float32 and out.device.type == "cpu"


@pytest.mark.parametrize(
    ("buckets", "rows", "model_batches"),
    [
        ((4, 8), 5, [8]),  # padded up to the next bucket
        ((2, 4), 9, [4, 4, 2]),  # beyond the largest bucket: chunks of it, the last one padded
    ],
)
def test_buckets_pad_and_chunk_and_return_only_real_rows(
    tiny: _Tiny, buckets: tuple[int, ...], rows: int, model_batches: list[int]
) -> None:
    backend = make_backend("cpu", copy.deepcopy(tiny), "cpu", batch_buckets=buckets)
    seen: list[int] = []
    forward = backend._forward
    backend._forward = lambda *xs: (seen.append(xs[0].shape[0]), forward(*xs))[1]
    inputs = _tiny_inputs(rows)
    out = backend(*inputs)
    assert seen == model_batches
    assert out.shape[0] == rows
    with torch.inference_mode():
        assert torch.allclose(out, tiny(*inputs), atol=1e-6, rtol=1e-6)


def test_bucket_for() -> None:
    assert bucket_for((2, 4), 1) == 2 and bucket_for((2, 4), 3) == 4 and bucket_for((2, 4), 40) == 4
    assert bucket_for((), 7) == 7
    backend = make_backend("cpu", torch.nn.Identity(), "cpu", batch_buckets=(4, 2))
    assert backend.bucket_for(1) == 2 and backend.bucket_for(3) == 4 and backend.bucket_for(40) == 4


def test_cuda_graphs_ignored_on_cpu(tiny: _Tiny) -> None:
    backend = make_backend("torch", copy.deepcopy(tiny), "cpu", cuda_graphs=True, batch_buckets=(4,))
    assert backend.cuda_graphs is False and "cuda_graphs ignored off CUDA" in backend.spec.reason
    took = backend.warmup(_tiny_inputs)
    assert list(took) == [4]
    assert backend(*_tiny_inputs(3)).shape[0] == 3


@pytest.mark.parametrize("precision, bound", [("fp32", 1e-6), ("bf16", 2e-2), ("fp16", 5e-3)])
def test_precisions_channels_last_and_fold_on_cpu(tiny: _Tiny, precision: str, bound: float) -> None:
    backend = make_backend(
        "torch", copy.deepcopy(tiny), "cpu", precision=precision, channels_last=True, fold_bn=True, batch_buckets=(4,)
    )
    assert backend.precision == precision and backend.channels_last and backend.fold_bn
    err = numerics_check(backend, tiny, _tiny_inputs(3), bound=bound)
    assert 0 <= err <= bound


def test_numerics_check_raises_over_bound_with_the_numbers(tiny: _Tiny) -> None:
    broken = copy.deepcopy(tiny)
    with torch.no_grad():
        broken.a[0].weight.mul_(1.5)
    backend = make_backend("cpu", broken, "cpu")
    with pytest.raises(RuntimeError, match=r"relative error [0-9.e+-]+ exceeds bound 1\.0e-02"):
        numerics_check(backend, tiny, _tiny_inputs(2), bound=1e-2)


def test_numerics_check_does_not_touch_the_reference(tiny: _Tiny) -> None:
    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    numerics_check(
        make_backend("torch", copy.deepcopy(tiny), "cpu", precision="bf16"), tiny, _tiny_inputs(2), bound=5e-2
    )
    assert all(torch.equal(before[k], v) and v.dtype == before[k].dtype for k, v in tiny.state_dict().items())


def test_bad_precision_is_rejected(tiny: _Tiny) -> None:
    with pytest.raises(ValueError, match="precision 'int8'"):
        make_backend("torch", tiny, "cpu", precision="int8")


# --------------------------------------------------------------------------------------------------
# make_backend
# --------------------------------------------------------------------------------------------------


def test_make_backend_auto_and_cpu_on_cpu(tiny: _Tiny) -> None:
    for kind in ("auto", "cpu"):
        backend = make_backend(kind, copy.deepcopy(tiny), "cpu", max_batch=64)
        assert (backend.name, backend.precision, backend.batch_buckets, backend.fold_bn) == ("cpu", "fp32", (), False)
    with pytest.raises(ValueError, match="not one of"):
        make_backend("onnxruntime", tiny, "cpu")


def test_default_buckets_end_at_max_batch() -> None:
    assert default_buckets(None) == DEFAULT_BUCKETS
    assert default_buckets(128) == (8, 16, 32, 64, 128)
    assert default_buckets(100) == (8, 16, 32, 64, 100)
    assert default_buckets(4) == (4,)


def test_tensorrt_without_the_package_names_it(tiny: _Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorrt" else real(name, *a))
    with pytest.raises(RuntimeError, match="tensorrt backend needs the tensorrt package"):
        make_backend("tensorrt", tiny, "cpu")


def test_onnx_export_has_a_dynamic_batch_axis(tiny: _Tiny, tmp_path: Path) -> None:
    """The TensorRT path's first step, checked with onnxruntime (dev extra) where TensorRT is absent."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    folded = fold_conv_bn(tiny)
    names = export_onnx(folded, [x[:1] for x in _tiny_inputs(1)], tmp_path / "m.onnx")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    inputs = _tiny_inputs(5)
    (out,) = session.run(None, {n: x.numpy() for n, x in zip(names, inputs)})
    with torch.inference_mode():
        assert relative_error(torch.from_numpy(out), tiny(*inputs)) < 1e-5


def test_compile_cache_key_depends_on_weights_precision_and_buckets(tiny: _Tiny, tmp_path: Path) -> None:
    def key(model: nn.Module, **kw: object) -> str:
        return resolve_backend_spec("compile", "cpu", model=model, cache_dir=tmp_path, log=False, **kw).cache_key

    base = key(tiny, precision="fp32", batch_buckets=(4, 8))
    assert base == key(tiny, precision="fp32", batch_buckets=(8, 4))
    assert base != key(tiny, precision="bf16", batch_buckets=(4, 8))
    assert base != key(tiny, precision="fp32", batch_buckets=(4, 16))
    assert base != key(tiny, precision="fp32", batch_buckets=(4, 8), fold_bn=True)
    assert base != key(tiny, precision="fp32", batch_buckets=(4, 8), compile_mode="default")
    other = copy.deepcopy(tiny)
    with torch.no_grad():
        other.a[0].bias.add_(1e-3)
    assert base != key(other, precision="fp32", batch_buckets=(4, 8))


def test_the_compiled_backend_reads_its_cache_path_from_the_spec(tiny: _Tiny, tmp_path: Path) -> None:
    """The key is decided once, before anything is built; the constructor only reads it."""
    # Construction is cheap: torch.compile only wraps; nothing compiles before the first call.
    spec = resolve_backend_spec(
        "compile",
        "cpu",
        model=tiny,
        precision="fp32",
        batch_buckets=(4,),
        fold_bn=True,
        compile_mode="default",
        cache_dir=tmp_path,
        log=False,
    )
    assert spec.cache_path == tmp_path / f"{spec.cache_key}.bin"
    backend = build_backend(spec, tiny)
    assert isinstance(backend, CompiledBackend) and backend.spec is spec
    assert (backend.cache_path, backend.cache_key) == (spec.cache_path, spec.cache_key)
    unfolded = resolve_backend_spec(
        "compile",
        "cpu",
        model=tiny,
        precision="fp32",
        batch_buckets=(4,),
        compile_mode="default",
        cache_dir=tmp_path,
        log=False,
    )
    assert unfolded.cache_path != spec.cache_path
    assert resolve_backend_spec("compile", "cpu", model=tiny, log=False).cache_path is None  # no dir: not kept
    assert resolve_backend_spec("torch", "cpu", model=tiny, cache_dir=tmp_path, log=False).cache_key == ""


def test_auto_compiles_only_where_a_warm_cache_exists() -> None:
    assert auto_kind(torch.device("cpu"), warm_compile_cache=True) == "cpu"
    assert auto_kind(torch.device("cuda"), warm_compile_cache=False) == "torch"
    expected = "compile" if importlib.util.find_spec("triton") is not None else "torch"
    assert auto_kind(torch.device("cuda"), warm_compile_cache=True) == expected


def test_compile_backend_survives_a_corrupt_cache_file(tiny: _Tiny, tmp_path: Path) -> None:
    backend = make_backend(
        "compile", copy.deepcopy(tiny), "cpu", precision="fp32", cache_dir=tmp_path, batch_buckets=(4,)
    )
    assert isinstance(backend, CompiledBackend)
    assert backend.cache_path is not None and backend.cache_loaded is False
    backend.cache_path.write_bytes(b"not a cache")
    again = make_backend(
        "compile", copy.deepcopy(tiny), "cpu", precision="fp32", cache_dir=tmp_path, batch_buckets=(4,)
    )
    assert isinstance(again, CompiledBackend)
    assert again.cache_path == backend.cache_path and again.cache_loaded is False


@pytest.mark.slow
@pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("LIPLINE_TEST_COMPILE_CPU") != "1",
    reason="torch.compile takes ~40 s on a 2-core CPU; set LIPLINE_TEST_COMPILE_CPU=1 to run it there",
)
def test_compile_backend_matches_eager_and_writes_its_cache(tiny: _Tiny, tmp_path: Path) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = make_backend(
        "compile",
        copy.deepcopy(tiny),
        device,
        precision="fp32",
        batch_buckets=(4,),
        cache_dir=tmp_path,
        compile_mode="default",
    )
    backend.warmup(_tiny_inputs)
    assert backend.compile_seconds is not None and backend.compile_seconds > 0
    assert backend.cache_path is not None and backend.cache_path.is_file()
    numerics_check(backend, tiny, _tiny_inputs(3), bound=1e-3)


# --------------------------------------------------------------------------------------------------
# GPU only
# --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_graph_backend_matches_eager_and_reference_on_gpu(wav2lip: Wav2Lip) -> None:
    backend = make_backend("auto", copy.deepcopy(wav2lip), "cuda", batch_buckets=(4, 8))
    assert backend.cuda_graphs and backend.fold_bn and backend.precision == "fp16"
    backend.warmup(_wav2lip_inputs)
    assert sorted(backend._graphs) == [4, 8]
    eager = make_backend("torch", copy.deepcopy(wav2lip), "cuda", fold_bn=True, batch_buckets=(4, 8))
    inputs = _wav2lip_inputs(5)
    graphed = backend(*inputs)
    assert graphed.shape == (5, 3, 96, 96) and graphed.device.type == "cpu"
    assert relative_error(graphed, eager(*inputs)) < 1e-3
    numerics_check(backend, wav2lip, inputs, bound=1e-2)
    # Replays with a different row count reuse the same graph and stay right.
    assert relative_error(backend(*_wav2lip_inputs(3)), eager(*_wav2lip_inputs(3))) < 1e-3


@pytest.mark.gpu
def test_bf16_graphs_on_gpu(wav2lip: Wav2Lip) -> None:
    backend = make_backend(
        "torch", copy.deepcopy(wav2lip), "cuda", precision="bf16", fold_bn=True, cuda_graphs=True, batch_buckets=(2,)
    )
    backend.warmup(_wav2lip_inputs)
    numerics_check(backend, wav2lip, _wav2lip_inputs(2), bound=2e-2)


@pytest.mark.gpu
def test_compile_backend_captures_its_compiled_forward_in_cuda_graphs(tiny: _Tiny, tmp_path: Path) -> None:
    backend = make_backend(
        "compile", copy.deepcopy(tiny), "cuda", batch_buckets=(2, 4), cache_dir=tmp_path, compile_mode="default"
    )
    assert backend.cuda_graphs and backend.fold_bn
    backend.warmup(_tiny_inputs)
    assert sorted(backend._graphs) == [2, 4] and not backend._graphs_failed
    eager = make_backend("torch", copy.deepcopy(tiny), "cuda", fold_bn=True, batch_buckets=(2, 4))
    for n in (3, 1, 4):  # replays with fewer rows than the bucket stay right
        assert relative_error(backend(*_tiny_inputs(n)), eager(*_tiny_inputs(n))) < 1e-2
    numerics_check(backend, tiny, _tiny_inputs(3), bound=1e-2)


@pytest.mark.gpu
def test_auto_picks_compile_once_its_cache_is_warm(tiny: _Tiny, tmp_path: Path) -> None:
    opts = dict(batch_buckets=(2,), cache_dir=tmp_path, compile_mode="default")
    cold = make_backend("auto", copy.deepcopy(tiny), "cuda", **opts)
    assert cold.kind == "torch" and cold.cuda_graphs
    filled = make_backend("compile", copy.deepcopy(tiny), "cuda", **opts)
    filled.warmup(_tiny_inputs)
    warm = make_backend("auto", copy.deepcopy(tiny), "cuda", **opts)
    assert isinstance(warm, CompiledBackend) and warm.cache_loaded and warm.cuda_graphs
    warm.warmup(_tiny_inputs)
    numerics_check(warm, tiny, _tiny_inputs(2), bound=1e-2)


def test_compile_modes_with_inductor_graphs_turn_ours_off(tiny: _Tiny) -> None:
    assert compile_mode_allows_graphs("max-autotune-no-cudagraphs") and compile_mode_allows_graphs("default")
    assert not compile_mode_allows_graphs("reduce-overhead") and not compile_mode_allows_graphs("max-autotune")
    backend = make_backend(
        "compile",
        copy.deepcopy(tiny),
        "cpu",
        precision="fp32",
        compile_mode="reduce-overhead",
        cuda_graphs=True,
        batch_buckets=(4,),
    )
    assert backend.cuda_graphs is False and "Inductor's own" in backend.spec.reason


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.slow
def test_tensorrt_backend_builds_and_matches(tiny: _Tiny, tmp_path: Path) -> None:
    backend = make_backend("tensorrt", copy.deepcopy(tiny), "cuda", batch_buckets=(2, 4), cache_dir=tmp_path)
    backend.warmup(_tiny_inputs)
    assert list(tmp_path.glob("trt-*.engine"))
    numerics_check(backend, tiny, _tiny_inputs(3), bound=1e-2)


def test_lipsync_service_import_chain_needs_no_av_or_librosa() -> None:
    """The GPU benchmark box has neither PyAV nor librosa: the lipsync service must not import them."""
    import importlib.util
    import subprocess
    import sys

    for module in ("grpc_health", "grpc_reflection", "prometheus_client", "opentelemetry", "lipline"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the lipsync service itself needs {module}, which is not installed here")
    code = (
        "import sys, services.lipsync.__main__, services.lipsync.service, services.inference.backends; "
        "print(sorted(m for m in ('av', 'librosa', 'tensorrt', 'onnx') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_backends_leave_the_callers_module_alone(tiny: _Tiny) -> None:
    """The caller's module is the fp32 reference of the numerics guard: no backend may cast it."""
    model = copy.deepcopy(tiny)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for fold in (False, True):
        make_backend("torch", model, "cpu", precision="bf16", fold_bn=fold, channels_last=True)
    after = model.state_dict()
    for key, value in before.items():
        assert after[key].dtype == value.dtype and torch.equal(after[key], value), key
        assert after[key].is_contiguous(), f"{key} was made channels_last"


# --------------------------------------------------------------------------------------------------
# resolve_backend_spec: the one decision
# --------------------------------------------------------------------------------------------------


def test_auto_on_the_cpu_is_eager_fp32_without_buckets(tiny: _Tiny, tmp_path: Path) -> None:
    spec = resolve_backend_spec("auto", "cpu", model=tiny, max_batch=64, cache_dir=tmp_path, log=False)
    assert (spec.kind, spec.name, spec.precision, spec.buckets) == ("torch", "cpu", "fp32", ())
    assert not (spec.fold_bn or spec.cuda_graphs or spec.channels_last or spec.cache_key)
    assert spec.reason == "no CUDA device" and spec.warmup_batches == (1,)


@pytest.fixture()
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lets the spec be resolved for "cuda" without a GPU (only the cache key asks the device)."""
    monkeypatch.setattr(spec_module, "_device_tag", lambda device: "fake-gpu sm90 cuda12")


def test_auto_on_cuda_compiles_only_with_a_warm_cache(tiny: _Tiny, tmp_path: Path, fake_gpu: None) -> None:
    cold = resolve_backend_spec("auto", "cuda", model=tiny, max_batch=64, cache_dir=tmp_path, log=False)
    assert (cold.kind, cold.precision, cold.fold_bn, cold.cuda_graphs, cold.channels_last) == (
        "torch",
        "fp16",
        True,
        True,
        True,
    )
    assert cold.buckets == (8, 16, 32, 64) and cold.reason.startswith("no warm compile cache at ")
    would = resolve_backend_spec("compile", "cuda", model=tiny, max_batch=64, cache_dir=tmp_path, log=False)
    assert would.cache_path is not None and would.fold_bn and would.cuda_graphs
    would.cache_path.write_bytes(b"artifacts")  # what a compile pod leaves behind
    warm = resolve_backend_spec("auto", "cuda", model=tiny, max_batch=64, cache_dir=tmp_path, log=False)
    has_triton = importlib.util.find_spec("triton") is not None
    assert warm.kind == ("compile" if has_triton else "torch")
    if has_triton:
        assert warm.cache_path == would.cache_path and warm.reason.startswith("compile cache warm")
    fallback = resolve_backend_spec(
        "auto", "cuda", model=tiny, max_batch=64, cache_dir=tmp_path, allow_compile=False, log=False
    )
    assert fallback.kind == "torch" and fallback.reason == "compile not allowed (fallback)"
    # The same warm cache on the CPU changes nothing.
    cpu = resolve_backend_spec("auto", "cpu", model=tiny, max_batch=64, cache_dir=tmp_path, log=False)
    assert cpu.name == "cpu"


def test_buckets_come_from_max_batch_where_the_kind_needs_them(tiny: _Tiny, fake_gpu: None) -> None:
    assert resolve_backend_spec("torch", "cuda", max_batch=100, cuda_graphs=True, log=False).buckets == (
        8,
        16,
        32,
        64,
        100,
    )
    assert resolve_backend_spec("torch", "cuda", max_batch=100, log=False).buckets == ()  # eager: no padding
    assert resolve_backend_spec("compile", "cpu", model=tiny, max_batch=64, log=False).buckets == (8, 16, 32, 64)
    assert resolve_backend_spec("compile", "cpu", model=tiny, log=False).buckets == DEFAULT_BUCKETS
    explicit = resolve_backend_spec("auto", "cuda", max_batch=100, batch_buckets=(32, 4, 32), log=False)
    assert explicit.buckets == (4, 32) and explicit.warmup_batches == (32, 4)
    assert explicit.bucket_for(5) == 32 and explicit.chunk_rows(100) == 32
    with pytest.raises(ValueError, match="must be positive"):
        resolve_backend_spec("torch", "cpu", batch_buckets=(0, 4), log=False)
    with pytest.raises(ValueError, match="not one of"):
        resolve_backend_spec("onnxruntime", "cpu", log=False)


def test_the_decision_is_logged_in_one_line(tiny: _Tiny, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="services.inference.backends"):
        backend = make_backend("auto", copy.deepcopy(tiny), "cpu", max_batch=16, cuda_graphs=True)
        backend.warmup(_tiny_inputs)
    decisions = [r for r in caplog.records if " -> " in r.getMessage()]
    assert [r.getMessage() for r in decisions] == [
        "backend auto -> cpu[fp32] on cpu (no CUDA device; cuda_graphs ignored off CUDA)"
    ]
    assert decisions[0].levelno == logging.INFO and decisions[0].buckets == []
    assert len(caplog.records) == 2  # the decision and one warm-up line, nothing else


def test_the_tensorrt_spec_is_folded_fp32_export_with_buckets(
    tiny: _Tiny, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_gpu: None
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "tensorrt" else real(name, *a)
    )
    spec = resolve_backend_spec("tensorrt", "cuda", model=tiny, max_batch=32, cache_dir=tmp_path, log=False)
    assert (spec.kind, spec.precision, spec.fold_bn, spec.channels_last, spec.cuda_graphs) == (
        "tensorrt",
        "fp16",
        True,
        False,
        False,
    )
    assert spec.buckets == (8, 16, 32) and spec.cache_path == tmp_path / f"trt-{spec.cache_key}.engine"
    assert not issubclass(TensorRTBackend, TorchBackend)  # the shared spec-driven base, not the eager backend


_BUCKET_RULES = re.compile(
    r"def (default_buckets|bucket_for|_?normalise_buckets)\((?!self)|DEFAULT_BUCKETS\s*[:=]|buckets\s+(?:or|else)\s+\(\d"
    r"|for b in .*buckets.*:\s*\n\s*if b >= "
)


def test_no_module_but_the_spec_decides_buckets() -> None:
    """The bucket rule (and the warm-up fallback) lives in services/inference/backends/spec.py only; the
    backends' and the protocol's `bucket_for(self, n)` only delegate to it."""
    root = Path(__file__).resolve().parents[3]
    offenders = []
    for path in [*(root / "services").rglob("*.py"), *(root / "bench").rglob("*.py")]:
        if path == root / "services" / "inference" / "backends" / "spec.py":
            continue
        for match in _BUCKET_RULES.finditer(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(root)}: {match.group(0).strip()}")
    assert not offenders, offenders
    assert _BUCKET_RULES.search((root / "services/inference/backends/spec.py").read_text(encoding="utf-8"))


_AUTOTUNE_SEEN: list[bool] = []  # module-level: the reference pass runs on a deep copy of the module


class _RecordsAutotune(nn.Module):
    """Notes whether cuDNN's autotuner was on when it ran (the flag is a process setting, CPU or not)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _AUTOTUNE_SEEN.append(torch.backends.cudnn.benchmark)
        return x * self.scale


def test_the_reference_pass_runs_without_cudnn_autotune_and_restores_it() -> None:
    """The guard's one-off fp32 pass must not time every convolution's algorithms first (20 s of a warm
    start on the GPU); the stage's own setting is back afterwards."""
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    _AUTOTUNE_SEEN.clear()
    try:
        out = reference_output(_RecordsAutotune(), [torch.ones(2)], "cpu")
        assert torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark = saved
    assert torch.equal(out, torch.ones(2))
    assert _AUTOTUNE_SEEN == [False]
