"""`python -m services.superres.export`, run in-process: the ONNX file matches torch in onnxruntime (CPU).

The RRDB models' graph (RealESRGAN_x2plus: pixel-unshuffle, then the RRDB trunk) is exported with one
block instead of 23: the same operators and dynamic axes, without the minute a 23-block export and
check take on a 2-core machine (the CLI does the whole model).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch

from services.inference.backends import relative_error
from services.inference.onnx_export import seeded
from services.superres import export as sr_export
from services.superres.models import SR_MODELS, RRDBNet, create_sr_model

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = sr_export.main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", ["realesr-general-x4v3", "realesr-animevideov3"])
def test_export_matches_torch_with_dynamic_batch_and_size(tmp_path: Path, name: str) -> None:
    out = tmp_path / f"{name}.onnx"
    code, stdout, stderr = _run(["--model", name, "--seeded", "--out", str(out)])
    assert code == 0, stderr
    assert stdout.strip().splitlines()[-1].startswith(f"exported {out}: ")
    assert "image[batch,3,height,width] -> upscaled[batch,3,out_height,out_width]" in stdout

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # leave the cores to torch
    session = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["image"]
    assert [o.name for o in session.get_outputs()] == ["upscaled"]
    # Exported at 2x3x16x16, verified by the CLI at 3x3x24x32: here batch 1 at 20x28.
    image = torch.rand(1, 3, 20, 28, generator=torch.Generator().manual_seed(5))
    (got,) = session.run(["upscaled"], {"image": image.numpy()})
    scale = SR_MODELS[name]["scale"]
    assert got.shape == (1, 3, 20 * scale, 28 * scale)
    with torch.inference_mode():
        want = seeded(create_sr_model(name))(image)
    assert relative_error(torch.from_numpy(got), want) < 1e-4
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temp file left behind


def test_the_rrdb_graph_with_its_pixel_unshuffle_exports_with_dynamic_batch_and_size(tmp_path: Path) -> None:
    model = seeded(RRDBNet(scale=SR_MODELS["RealESRGAN_x2plus"]["scale"], num_block=1))
    report = sr_export.export_model(model, tmp_path / "x2.onnx", opset=17)
    session = ort.InferenceSession(str(tmp_path / "x2.onnx"), providers=["CPUExecutionProvider"])
    image = torch.rand(1, 3, 20, 28, generator=torch.Generator().manual_seed(5))  # even H and W: the unshuffle
    (got,) = session.run(["upscaled"], {"image": image.numpy()})
    with torch.inference_mode():
        want = model(image)
    assert got.shape == (1, 3, 40, 56) and relative_error(torch.from_numpy(got), want) < 1e-4, report


def test_from_checkpoint(tmp_path: Path) -> None:
    model = seeded(create_sr_model("realesr-animevideov3"))
    ckpt = tmp_path / "anime.pth"
    torch.save({"params": model.state_dict()}, ckpt)
    code, _, stderr = _run(
        [
            "--model",
            "realesr-animevideov3",
            "--checkpoint",
            str(ckpt),
            "--out",
            str(tmp_path / "a.onnx"),
            "--opset",
            "17",
        ]
    )
    assert code == 0, stderr


@pytest.mark.parametrize("kind", ["missing", "wrong-architecture"])
def test_bad_checkpoint_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    ckpt = tmp_path / "bad.pth"
    if kind == "wrong-architecture":  # 16-conv weights for the 32-conv model
        torch.save({"params": seeded(create_sr_model("realesr-animevideov3")).state_dict()}, ckpt)
    out = tmp_path / "sr.onnx"
    code, stdout, stderr = _run(["--model", "realesr-general-x4v3", "--checkpoint", str(ckpt), "--out", str(out)])
    assert code == 2
    assert stdout == ""
    assert stderr.startswith(f"error: checkpoint {ckpt}")
    if kind == "wrong-architecture":
        assert "does not fit SRVGGNetCompact" in stderr and "missing keys" in stderr
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert not out.exists()


def test_mismatch_exits_1_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import services.inference.onnx_export as onnx_check

    monkeypatch.setattr(onnx_check, "relative_error", lambda a, b: 1.0)
    out = tmp_path / "sr.onnx"
    code, _, stderr = _run(["--model", "realesr-animevideov3", "--seeded", "--out", str(out)])
    assert code == 1
    assert "relative error 1.000e+00 > 1e-04" in stderr and "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []


def test_unknown_model_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stderr(io.StringIO()):
        sr_export.main(["--model", "nope", "--seeded", "--out", "x.onnx"])
    assert exc.value.code == 2
