"""`TensorRTBackend`: an ONNX -> TensorRT engine, plus the ONNX export it starts from.

Needs the tensorrt package; NOT exercised in CI: written against the TensorRT 10 Python API
documentation (Builder/OnnxParser/IOptimizationProfile/execute_async_v3), to be verified on the GPU
before it is offered as a default.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from services.inference.backends.protocol import ExampleInputsFn
from services.inference.backends.spec import BackendSpec
from services.inference.backends.torch_backend import SpecBackend
from services.inference.folding import fold_conv_bn

__all__ = ["TensorRTBackend", "export_onnx"]

_LOGGER = logging.getLogger("services.inference.backends")


def export_onnx(
    module: nn.Module,
    example: Sequence[torch.Tensor],
    path: str | os.PathLike,
    opset: int = 17,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] = ("output",),
    dynamic_axes: dict[str, dict[int, str]] | None = None,
) -> list[str]:
    """Export `module` (fp32) to ONNX with a dynamic batch axis on every input and the output.

    Uses the TorchScript exporter (`dynamo=False`): it needs only the `onnx` package, not onnxscript.
    Returns the input names (default "input0", "input1", ...; the output is "output").
    `dynamic_axes` (name -> {axis: label}) replaces the default batch-only axes when given.
    """
    import warnings

    names = list(input_names) if input_names is not None else [f"input{i}" for i in range(len(example))]
    if len(names) != len(example):
        raise ValueError(f"{len(names)} input names for {len(example)} example inputs")
    axes = dynamic_axes if dynamic_axes is not None else {name: {0: "batch"} for name in [*names, *output_names]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "legacy TorchScript-based exporter"
        torch.onnx.export(
            module,
            tuple(example),
            str(path),
            input_names=names,
            output_names=list(output_names),
            dynamic_axes=axes,
            opset_version=opset,
            dynamo=False,
        )
    return names


class TensorRTBackend(SpecBackend):
    """ONNX -> TensorRT engine (the spec's precision as builder flag), one profile spanning the buckets.

    The engine is built (or read from `spec.cache_path`) in `warmup`, which needs example inputs for
    the export. Inference binds device pointers and calls `execute_async_v3` on the current torch
    stream; inputs/outputs stay float32 at the engine boundary. The folded fp32 module stays on the
    CPU as the export source only: TensorRT holds the weights on the GPU.
    """

    def __init__(self, module: nn.Module, spec: BackendSpec) -> None:
        import tensorrt as trt  # noqa: F401 - fail here, not in warmup, when it is missing

        if spec.kind != "tensorrt" or spec.device.type != "cuda" or not spec.buckets:
            raise ValueError(f"TensorRTBackend needs a tensorrt spec on CUDA with buckets, got {spec.describe()}")
        super().__init__(spec)
        self.export_source = fold_conv_bn(module).eval().float().cpu()  # a copy
        self._context: Any = None  # TensorRT's objects: the package has no stubs (and is optional)
        self._engine: Any = None
        self._input_names: list[str] = []

    def _build(self, example: Sequence[torch.Tensor]) -> None:
        import tensorrt as trt

        buckets = self.spec.buckets
        cache = self.spec.cache_path
        logger = trt.Logger(trt.Logger.WARNING)
        names = [f"input{i}" for i in range(len(example))]
        if cache is not None and cache.is_file():
            blob = cache.read_bytes()
        else:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                onnx_path = Path(tmp) / "model.onnx"
                names = export_onnx(self.export_source, [x[:1].float().cpu() for x in example], onnx_path)
                builder = trt.Builder(logger)
                network = builder.create_network(0)  # explicit batch is the only mode in TRT 10
                parser = trt.OnnxParser(network, logger)
                if not parser.parse_from_file(str(onnx_path)):
                    errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
                    raise RuntimeError(f"TensorRT could not parse the ONNX export: {errors}")
            config = builder.create_builder_config()
            if self.precision == "fp16":
                config.set_flag(trt.BuilderFlag.FP16)
            elif self.precision == "bf16":
                config.set_flag(trt.BuilderFlag.BF16)
            profile = builder.create_optimization_profile()
            lo, hi = buckets[0], buckets[-1]
            opt = buckets[len(buckets) // 2]
            for name, x in zip(names, example):
                rest = tuple(x.shape[1:])
                profile.set_shape(name, (1, *rest), (opt, *rest), (hi, *rest))
            config.add_optimization_profile(profile)
            _LOGGER.info("building TensorRT engine (minutes)", extra={"batches": [lo, opt, hi]})
            serialized = builder.build_serialized_network(network, config)
            if serialized is None:
                raise RuntimeError("TensorRT engine build failed (see the TensorRT log above)")
            blob = bytes(serialized)
            if cache is not None:
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_bytes(blob)
        runtime = trt.Runtime(logger)
        self._engine = runtime.deserialize_cuda_engine(blob)
        self._context = self._engine.create_execution_context()
        self._input_names = names

    def _run_chunk(self, chunk: Sequence[torch.Tensor]) -> torch.Tensor:
        if self._context is None:
            raise RuntimeError("TensorRTBackend: call warmup(example_inputs_fn) first (it builds the engine)")
        ctx = self._context
        xs = [x.to(self.device, torch.float32).contiguous() for x in chunk]
        for name, x in zip(self._input_names, xs):
            ctx.set_input_shape(name, tuple(x.shape))
            ctx.set_tensor_address(name, x.data_ptr())
        out = torch.empty(tuple(ctx.get_tensor_shape("output")), device=self.device, dtype=torch.float32)
        ctx.set_tensor_address("output", out.data_ptr())
        if not ctx.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        return out

    @torch.inference_mode()
    def warmup(self, example_inputs_fn: ExampleInputsFn) -> dict[int, float]:
        if self._context is None:
            with torch.inference_mode(False):
                self._build(list(example_inputs_fn(self.spec.buckets[0])))
        return super().warmup(example_inputs_fn)
