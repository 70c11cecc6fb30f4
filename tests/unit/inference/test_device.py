"""services.inference.device: the pipeline depth's auto default."""

from __future__ import annotations

import pytest
import torch

from services.inference.device import resolve_pipeline_depth


def test_auto_pipeline_depth_is_two_on_cuda_and_one_on_the_cpu() -> None:
    assert resolve_pipeline_depth(0, torch.device("cpu")) == 1
    assert resolve_pipeline_depth(0, torch.device("cuda")) == 2  # a device object needs no GPU
    assert resolve_pipeline_depth(3, torch.device("cpu")) == 3
    assert resolve_pipeline_depth(1, torch.device("cuda")) == 1
    with pytest.raises(ValueError, match="pipeline_depth"):
        resolve_pipeline_depth(-1, torch.device("cpu"))
