"""`python -m services.superres.export`: a Real-ESRGAN model to ONNX, checked in onnxruntime.

    python -m services.superres.export --model realesr-general-x4v3 --checkpoint x.pth --out sr.onnx [--opset 17]
    python -m services.superres.export --model RealESRGAN_x2plus --seeded --out /tmp/sr.onnx   # synthetic weights

Graph: input `image` (B, 3, H, W) RGB in [0, 1], output `upscaled` (B, 3, H*s, W*s); batch, height
and width are dynamic (RealESRGAN_x2plus needs even H and W). Exit codes: see services.inference.onnx_export.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import torch
from torch import nn

from services.inference.onnx_export import ExportReport, add_common_arguments, export_verified, run_cli, seeded
from services.superres.models import SR_MODELS, create_sr_model

INPUT_NAME = "image"
OUTPUT_NAME = "upscaled"
# The traced example and the check differ in batch, height and width, so every dynamic axis is exercised.
EXPORT_SHAPE = (2, 3, 16, 16)
VERIFY_SHAPE = (3, 3, 24, 32)


def example_image(shape: Sequence[int], seed: int = 0) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m services.superres.export", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, choices=list(SR_MODELS), help="which network")
    add_common_arguments(parser)
    return parser


def export(args: argparse.Namespace) -> ExportReport:
    model = seeded(create_sr_model(args.model)) if args.seeded else create_sr_model(args.model, args.checkpoint)
    return export_model(model, args.out, args.opset)


def export_model(model: nn.Module, out: str | os.PathLike, opset: int) -> ExportReport:
    """`model` (any of SR_MODELS' architectures) as ONNX with a dynamic batch and image size, checked
    in onnxruntime at another shape than it was traced at."""
    axes = {
        INPUT_NAME: {0: "batch", 2: "height", 3: "width"},
        OUTPUT_NAME: {0: "batch", 2: "out_height", 3: "out_width"},
    }
    return export_verified(
        model,
        model,
        [example_image(EXPORT_SHAPE)],
        [example_image(VERIFY_SHAPE, seed=1)],
        out,
        input_names=[INPUT_NAME],
        output_name=OUTPUT_NAME,
        dynamic_axes=axes,
        opset=opset,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(export, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
