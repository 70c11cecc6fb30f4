"""DeviceBatchEngine: parts grouped by size, in any order, come back per chunk in item order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.inference.engine import DeviceBatchEngine, Part

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class _Images(DeviceBatchEngine[list]):
    """A stage whose 'model' makes image i of the batch h x w, filled with i: sizes alternate, and
    the parts come back largest size first (not in batch order), as a resize by size would."""

    SIZES = [(3, 2), (5, 4)]  # (w, h)

    def process(self, chunks: list[list]) -> list[Part]:
        n = sum(len(c) for c in chunks)
        parts: list[Part] = []
        for k, (w, h) in reversed(list(enumerate(self.SIZES))):
            positions = [i for i in range(n) if i % 2 == k]
            images = torch.tensor(positions, dtype=torch.uint8, device=self.device).view(-1, 1, 1, 1).expand(-1, h, w, 3)
            parts.append((positions, images.contiguous()))
        return parts


@pytest.mark.parametrize("device", DEVICES)
def test_chunks_get_their_images_in_item_order(device: str) -> None:
    engine = _Images(torch.device(device), overlap=False)
    chunks = [[0, 1, 2], [], [3, 4]]
    out = engine.run(chunks)
    assert [len(p) for p in out] == [3, 0, 2]
    position = 0
    for packed in out:
        for j, image in enumerate(packed.arrays()):
            w, h = _Images.SIZES[position % 2]
            assert (packed.widths[j], packed.heights[j]) == (w, h)
            assert image.shape == (h, w, 3) and (image == position).all()
            position += 1
    assert position == 5


def test_a_batch_without_items_does_not_reach_the_model() -> None:
    class NoModel(_Images):
        def process(self, chunks: list[list]) -> list[Part]:
            raise AssertionError("process called for an empty batch")

    out = NoModel(torch.device("cpu"), overlap=False).run([[], []])
    assert [(len(p), p.data) for p in out] == [(0, b""), (0, b"")]


def test_cpu_parts_are_read_without_a_copy_of_the_batch() -> None:
    engine = _Images(torch.device("cpu"), overlap=False)
    images = torch.zeros((2, 2, 3, 3), dtype=torch.uint8)
    (host,) = engine._to_host([([0, 1], images)])
    assert np.shares_memory(host, images.numpy())
