"""`python -m services.lipsync.export`, run in-process: the ONNX file matches torch in onnxruntime (CPU)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch
from torch import nn

from services.inference.backends import relative_error
from services.inference.onnx_export import seeded
from services.lipsync.export import example_inputs, main
from services.lipsync.wav2lip import Wav2Lip

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # leave the cores to torch
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _rel_errors(path: Path, model: nn.Module, batches: tuple[int, ...]) -> list[float]:
    session = _session(path)
    errors = []
    for batch in batches:
        mel, face = example_inputs(batch, seed=7)
        (pred,) = session.run(["pred"], {"mel": mel.numpy(), "face": face.numpy()})
        with torch.inference_mode():
            want = model(mel, face)
        assert pred.shape == (batch, 3, 96, 96)
        errors.append(relative_error(torch.from_numpy(pred), want))
    return errors


@pytest.fixture(scope="module")
def seeded_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("w2l") / "sub" / "wav2lip.onnx"  # a missing parent is created
    code, stdout, stderr = _run(["--seeded", "--out", str(path)])
    assert code == 0, stderr
    return path, stdout


def test_graph_names_and_dynamic_batch(seeded_export: tuple[Path, str]) -> None:
    path, _ = seeded_export
    session = _session(path)
    assert [(i.name, i.shape) for i in session.get_inputs()] == [
        ("mel", ["batch", 1, 80, 16]),
        ("face", ["batch", 6, 96, 96]),
    ]
    assert [(o.name, o.shape) for o in session.get_outputs()] == [("pred", ["batch", 3, 96, 96])]
    # Exported with batch 2, verified by the CLI with 3: here 1 and 4.
    assert max(_rel_errors(path, seeded(Wav2Lip()), (1, 4))) < 1e-4
    assert [p.name for p in path.parent.iterdir()] == ["wav2lip.onnx"]  # no temp file left behind


def test_batchnorm_is_folded_by_default(seeded_export: tuple[Path, str]) -> None:
    """The exporter fuses Conv+BN itself; --fold-bn also folds the six ConvTranspose+BN pairs."""
    import onnx

    ops = {node.op_type for node in onnx.load(str(seeded_export[0])).graph.node}
    assert "BatchNormalization" not in ops and {"Conv", "ConvTranspose"} <= ops


def test_prints_errors_and_a_one_line_summary(seeded_export: tuple[Path, str]) -> None:
    path, stdout = seeded_export
    verify, summary = stdout.strip().splitlines()
    assert "max abs error" in verify and "relative error" in verify
    assert summary.startswith(f"exported {path}: ")
    for part in ("MB", "opset 17", "mel[batch,1,80,16] face[batch,6,96,96] -> pred[batch,3,96,96]", "rel "):
        assert part in summary


def test_checkpoint_with_real_batchnorm_statistics_folds_exactly(tmp_path: Path) -> None:
    """From a checkpoint (DataParallel keys, non-trivial BN): the folded graph matches the unfolded model."""
    model = seeded(Wav2Lip())
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    ckpt = tmp_path / "wav2lip.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, ckpt)
    out = tmp_path / "w.onnx"
    code, _, stderr = _run(["--checkpoint", str(ckpt), "--out", str(out), "--fold-bn", "--opset", "17"])
    assert code == 0, stderr
    assert max(_rel_errors(out, model, (1,))) < 1e-4


@pytest.mark.parametrize("kind", ["missing", "wrong-keys", "not-a-torch-file", "pickled-object"])
def test_bad_checkpoint_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    ckpt = tmp_path / "bad.pth"
    if kind == "wrong-keys":
        torch.save({"state_dict": {"conv.weight": torch.zeros(1)}}, ckpt)
    elif kind == "not-a-torch-file":
        ckpt.write_bytes(b"not a checkpoint")
    elif kind == "pickled-object":  # refused by weights_only loading (a multi-line torch message)
        torch.save({"state_dict": {"x": torch.zeros(1)}, "extra": object()}, ckpt)
    out = tmp_path / "w.onnx"
    code, stdout, stderr = _run(["--checkpoint", str(ckpt), "--out", str(out)])
    assert code == 2
    assert stdout == ""
    assert stderr.startswith(f"error: checkpoint {ckpt}")
    assert stderr.count("\n") == 1 and "\x1b" not in stderr and "Traceback" not in stderr
    assert not out.exists()


@pytest.mark.parametrize("argv", [["--out", "x.onnx"], ["--seeded", "--checkpoint", "x.pth", "--out", "x.onnx"]])
def test_exactly_one_weights_source(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stderr(io.StringIO()):
        main(argv)
    assert exc.value.code == 2
