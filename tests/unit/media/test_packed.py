"""PackedImages: the packed BGR24 result type of the model stages, and the response cutting they share."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from lipline.v1 import lipsync_pb2
from services.inference.stage import cut_responses
from services.media.packed import PackedImages
from services.serving.errors import InvalidMedia


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (h, w, 3), np.uint8) for w, h in [(3, 2), (1, 4), (5, 5)]]


def test_round_trip_through_generated_faces() -> None:
    arrays = _arrays()
    packed = PackedImages.from_arrays(arrays)
    assert len(packed) == 3 and packed.nbytes() == [18, 12, 75] and packed.offsets() == [0, 18, 30, 105]
    msg = packed.to_pb([7, 8, 9], [0, 1, 0])
    assert list(msg.frame_indices) == [7, 8, 9] and list(msg.crop_indices) == [0, 1, 0]
    back = PackedImages.from_pb(lipsync_pb2.GeneratedFaces.FromString(msg.SerializeToString()))
    assert all(np.array_equal(a, b) for a, b in zip(back.arrays(), arrays))
    assert [(w, h, data) for w, h, data in back.items()] == [(a.shape[1], a.shape[0], a.tobytes()) for a in arrays]


def test_slice_keeps_the_whole_blob_uncopied() -> None:
    packed = PackedImages.from_arrays(_arrays())
    assert packed.slice(0, 3) is packed
    tail = packed.slice(1, 3)
    assert (list(tail.widths), list(tail.heights), tail.data) == ([1, 5], [4, 5], packed.data[18:])


def test_from_pb_refuses_malformed_messages() -> None:
    msg = PackedImages.from_arrays(_arrays()).to_pb([7, 8, 9], [0, 0, 0])
    msg.data = msg.data[:-1]
    with pytest.raises(InvalidMedia, match="generated faces: sizes need 105 bytes, got 104"):
        PackedImages.from_pb(msg)
    msg = lipsync_pb2.GeneratedFaces(frame_indices=[1, 2], widths=[1, 1], heights=[1])
    with pytest.raises(InvalidMedia, match="index and size lists differ in length"):
        PackedImages.from_pb(msg)
    with pytest.raises(ValueError, match="uint8"):
        PackedImages.from_arrays([np.zeros((2, 2, 3), np.float32)])


def test_cut_responses_keeps_item_order_and_refuses_a_count_mismatch() -> None:
    packed = PackedImages.from_arrays(_arrays())

    def build(keys: Sequence[Sequence[int]], images: PackedImages) -> tuple[list[list[int]], PackedImages]:
        return [list(k) for k in keys], images

    runs = list(cut_responses(([7, 8, 9], [0, 1, 0]), packed, 40, 0, build))
    assert [keys for keys, _ in runs] == [[[7, 8], [0, 1]], [[9], [0]]]
    assert b"".join(images.data for _, images in runs) == packed.data
    (empty,) = cut_responses(([],), PackedImages([], [], b""), 40, 0, build)
    assert empty[0] == [[]] and len(empty[1]) == 0
    with pytest.raises(RuntimeError, match="returned 3 images for 2 items"):
        list(cut_responses(([7, 8],), packed, 40, 0, build))
