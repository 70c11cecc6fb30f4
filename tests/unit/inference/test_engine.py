"""DeviceBatchEngine: parts grouped by size, in any order, come back per chunk in item order; the
streams that overlap batches (BatchStreams)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.inference.engine import BatchStreams, DeviceBatchEngine, Part

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
            images = (
                torch.tensor(positions, dtype=torch.uint8, device=self.device).view(-1, 1, 1, 1).expand(-1, h, w, 3)
            )
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


def test_batch_streams_are_off_on_the_cpu_and_compute_is_serialised() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tests.helpers.occupancy import Occupancy

    streams = BatchStreams(torch.device("cpu"), overlap=True)
    assert not streams.enabled
    occupancy = Occupancy()

    def model_turn(_: int) -> None:
        with streams.io(), streams.compute(), occupancy.inside(0.01):
            pass

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(model_turn, range(8)))
    assert occupancy.peak == 1  # one model call at a time, whatever the callers' threads


@pytest.mark.gpu
def test_batch_streams_give_each_thread_its_io_stream_and_one_compute_stream() -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    streams = BatchStreams(torch.device("cuda"), overlap=True)
    default = torch.cuda.current_stream()
    both = threading.Barrier(2)  # two threads for sure

    def seen(_: int) -> tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream]:
        both.wait()
        with streams.io():
            io = torch.cuda.current_stream()
            with streams.compute():
                compute = torch.cuda.current_stream()
            return io, compute, torch.cuda.current_stream()

    with ThreadPoolExecutor(2) as pool:
        (io_a, compute_a, back_a), (io_b, compute_b, back_b) = pool.map(seen, range(2))
    assert io_a != io_b and default not in (io_a, io_b)  # one I/O stream per thread
    assert compute_a == compute_b not in (io_a, io_b)  # one compute stream
    assert (back_a, back_b) == (io_a, io_b)  # back on the thread's own stream afterwards
