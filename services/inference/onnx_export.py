"""What the `python -m services.<stage>.export` CLIs share: arguments, export + onnxruntime check, report.

A stage's CLI only builds its module, its example/verification inputs and its names; this module
exports (through `backends.export_onnx`) to a temporary file next to `--out`, runs the file in
onnxruntime (CPUExecutionProvider) on inputs whose shapes differ from the export example (so the
dynamic axes are exercised), compares against the fp32 torch reference, and renames the file into
place only when the relative error is within bound.

Exit codes of `run_cli`: 0 ok, 1 the exported model does not match torch, 2 bad checkpoint or a
missing package (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from services.inference.backends import export_onnx, relative_error
from services.inference.checkpoints import seeded_state_dict
from services.serving.errors import CheckpointError

__all__ = ["ExportMismatch", "ExportReport", "add_common_arguments", "export_verified", "run_cli", "seeded"]

DEFAULT_OPSET = 17
MAX_REL_ERROR = 1e-4
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ExportMismatch(RuntimeError):
    """The ONNX model's output differs from torch by more than the bound."""


@dataclass(frozen=True)
class ExportReport:
    path: Path
    size_mb: float
    opset: int
    inputs: list[str]  # "name[dim,...]" as onnxruntime reports them
    outputs: list[str]
    max_abs_error: float
    rel_error: float

    def summary(self) -> str:
        return (
            f"exported {self.path}: {self.size_mb:.1f} MB, opset {self.opset}, "
            f"{' '.join(self.inputs)} -> {' '.join(self.outputs)}, "
            f"onnxruntime vs torch: max abs {self.max_abs_error:.2e}, rel {self.rel_error:.2e}"
        )


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """--checkpoint | --seeded (exactly one), --out, --opset."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=Path, help="weights file (.pth)")
    source.add_argument(
        "--seeded",
        action="store_true",
        help="deterministic synthetic weights instead of a checkpoint (tests, benchmarks)",
    )
    parser.add_argument("--out", type=Path, required=True, help="the .onnx file to write")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset (default {DEFAULT_OPSET})")


def seeded(model: nn.Module) -> nn.Module:
    """`model` with `seeded_state_dict` weights, in eval mode."""
    model.load_state_dict(seeded_state_dict(model))
    return model.eval()


def _describe(args: Sequence[Any]) -> list[str]:
    """`name[dims]` of each of an onnxruntime session's inputs or outputs (its NodeArgs)."""
    return [f"{a.name}[{','.join(str(d) for d in a.shape)}]" for a in args]


def export_verified(
    module: nn.Module,
    reference: nn.Module,
    example: Sequence[torch.Tensor],
    verify_inputs: Sequence[torch.Tensor],
    out: str | os.PathLike,
    *,
    input_names: Sequence[str],
    output_name: str,
    dynamic_axes: dict[str, dict[int, str]],
    opset: int = DEFAULT_OPSET,
    max_rel_error: float = MAX_REL_ERROR,
) -> ExportReport:
    """Export `module` to `out` and check it in onnxruntime against `reference` on `verify_inputs`.

    `module` is what is exported (e.g. BN-folded); `reference` is the eval-mode fp32 torch model the
    file must reproduce. Writes `.<out>.<pid>.tmp` and renames it onto `out` only after the check passed;
    raises ExportMismatch (temp file removed, `out` untouched) when the relative error exceeds the bound.
    """
    import onnxruntime as ort

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Same folder, so the rename is atomic; a plain create (not mkstemp) keeps the umask's permissions.
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        export_onnx(
            module.eval(),
            [x.float().cpu() for x in example],
            tmp,
            opset,
            input_names=input_names,
            output_names=[output_name],
            dynamic_axes=dynamic_axes,
        )
        with torch.inference_mode():
            want = reference.eval()(*[x.float().cpu() for x in verify_inputs])
        options = ort.SessionOptions()
        # No busy-waiting workers left behind to compete with torch's threads in the same process.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(tmp), options, providers=["CPUExecutionProvider"])
        (got,) = session.run([output_name], {n: x.float().cpu().numpy() for n, x in zip(input_names, verify_inputs)})
        got_t = torch.from_numpy(got)
        rel = relative_error(got_t, want)
        max_abs = float((got_t.double() - want.double()).abs().max())
        shapes = " ".join(f"{n}{list(x.shape)}" for n, x in zip(input_names, verify_inputs))
        print(
            f"verify ({shapes}; onnxruntime CPU vs torch fp32): max abs error {max_abs:.3e}, relative error {rel:.3e} (bound {max_rel_error:.0e})",
            flush=True,
        )
        if not rel <= max_rel_error:  # also catches NaN
            raise ExportMismatch(
                f"ONNX output differs from torch: relative error {rel:.3e} > {max_rel_error:.0e} (max abs {max_abs:.3e}); {out} not written"
            )
        report = ExportReport(
            out,
            tmp.stat().st_size / 1e6,
            opset,
            _describe(session.get_inputs()),
            _describe(session.get_outputs()),
            max_abs,
            rel,
        )
        os.replace(tmp, out)
        return report
    finally:
        tmp.unlink(missing_ok=True)


def run_cli(export: Callable[[argparse.Namespace], ExportReport], args: argparse.Namespace) -> int:
    """Run `export(args)`, print the summary line; expected failures become one stderr line + exit code."""
    missing = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"error: export needs {' and '.join(missing)} (pip install {' '.join(missing)}, or the dev extra)",
            file=sys.stderr,
        )
        return 2
    try:
        report = export(args)
    except CheckpointError as exc:
        # One line: torch.load's weights_only message spans several (and carries ANSI bold codes).
        print(f"error: {' '.join(_ANSI.sub('', str(exc)).split())}", file=sys.stderr)
        return 2
    except ExportMismatch as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(report.summary(), flush=True)
    return 0
