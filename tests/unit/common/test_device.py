"""services.common.device: the pipeline depth's auto default and the optional-stream context."""

from __future__ import annotations

import pytest
import torch

from services.common.device import on_stream, resolve_pipeline_depth


def test_auto_pipeline_depth_is_two_on_cuda_and_one_on_the_cpu() -> None:
    assert resolve_pipeline_depth(0, torch.device("cpu")) == 1
    assert resolve_pipeline_depth(0, torch.device("cuda")) == 2  # a device object needs no GPU
    assert resolve_pipeline_depth(3, torch.device("cpu")) == 3
    assert resolve_pipeline_depth(1, torch.device("cuda")) == 1
    with pytest.raises(ValueError, match="pipeline_depth"):
        resolve_pipeline_depth(-1, torch.device("cpu"))


def test_on_stream_without_a_stream_changes_nothing() -> None:
    with on_stream(None):
        assert torch.ones(2).sum().item() == 2


@pytest.mark.gpu
def test_on_stream_switches_the_current_stream() -> None:
    stream = torch.cuda.Stream()
    with on_stream(stream):
        assert torch.cuda.current_stream() == stream
    assert torch.cuda.current_stream() != stream
