"""`python -m services.lipsync.export`: the Wav2Lip generator to ONNX, checked in onnxruntime.

    python -m services.lipsync.export --checkpoint wav2lip.pth --out wav2lip.onnx [--no-fold-bn] [--opset 17]
    python -m services.lipsync.export --seeded --out /tmp/wav2lip.onnx        # synthetic weights

Graph: inputs `mel` (B, 1, 80, 16) and `face` (B, 6, 96, 96), output `pred` (B, 3, 96, 96), B dynamic.
BatchNorm is folded into the convolutions by default (the inference graph every backend runs); the
check always compares against the unfolded eval-mode model. Exit codes: see services.inference.onnx_export.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from services.inference.folding import fold_conv_bn
from services.inference.onnx_export import ExportReport, add_common_arguments, export_verified, run_cli, seeded
from services.lipsync.wav2lip import WAV2LIP_INFO, Wav2Lip, load_wav2lip

INPUT_NAMES = ("mel", "face")
OUTPUT_NAME = "pred"
EXPORT_BATCH = 2  # the traced example; the check runs VERIFY_BATCH, so the dynamic axis is exercised
VERIFY_BATCH = 3


def example_inputs(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (mel in [-4, 4], faces in [0, 1]) of the generator's input shapes."""
    gen = torch.Generator().manual_seed(seed)
    size, steps = WAV2LIP_INFO["img_size"], WAV2LIP_INFO["mel_step_size"]
    mel = torch.rand(batch, 1, 80, steps, generator=gen) * 8 - 4
    face = torch.rand(batch, 6, size, size, generator=gen)
    return mel, face


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m services.lipsync.export", description=__doc__.split("\n")[0])
    add_common_arguments(parser)
    parser.add_argument(
        "--fold-bn",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fold BatchNorm into the convolutions (default: on)",
    )
    return parser


def export(args: argparse.Namespace) -> ExportReport:
    model = seeded(Wav2Lip()) if args.seeded else load_wav2lip(args.checkpoint)
    exported = fold_conv_bn(model) if args.fold_bn else model
    axes = {name: {0: "batch"} for name in (*INPUT_NAMES, OUTPUT_NAME)}
    return export_verified(
        exported,
        model,
        example_inputs(EXPORT_BATCH),
        example_inputs(VERIFY_BATCH, seed=1),
        args.out,
        input_names=INPUT_NAMES,
        output_name=OUTPUT_NAME,
        dynamic_axes=axes,
        opset=args.opset,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(export, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
