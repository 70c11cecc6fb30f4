"""`PackedImages`: BGR24 images back to back in one bytes object, with their sizes.

The one result type of the model stages' engines (lipsync's faces, superres' restored faces), of
their servicers' response cutting and of their clients' decoding: `from_pb` validates a packed
`GeneratedFaces` message (a malformed one is an InvalidMedia, not a reshape error), `to_pb` builds
one, `item`/`arrays` cut the images back out. Numpy only: the torch-free render worker decodes with it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np

from lipline.v1 import lipsync_pb2
from services.serving.errors import InvalidMedia


@dataclasses.dataclass(frozen=True)
class PackedImages:
    """BGR24 images back to back, in item order: image i is heights[i] * widths[i] * 3 bytes of `data`."""

    widths: Sequence[int]
    heights: Sequence[int]
    data: bytes

    def __len__(self) -> int:
        return len(self.widths)

    @classmethod
    def from_arrays(cls, arrays: Sequence[np.ndarray]) -> PackedImages:
        """(H, W, 3) uint8 BGR arrays -> one packed blob (one copy of each)."""
        for i, a in enumerate(arrays):
            if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3:
                raise ValueError(f"image {i} must be a (H, W, 3) uint8 array, got {a.dtype} {a.shape}")
        return cls([a.shape[1] for a in arrays], [a.shape[0] for a in arrays], b"".join(a.tobytes() for a in arrays))

    @classmethod
    def from_pb(cls, faces: lipsync_pb2.GeneratedFaces, what: str = "generated faces") -> PackedImages:
        """A GeneratedFaces message's images (its frame and crop indices stay in the message); validated."""
        widths, heights = list(faces.widths), list(faces.heights)
        if not len(faces.frame_indices) == len(widths) == len(heights):
            raise InvalidMedia(f"{what}: index and size lists differ in length")
        expected = sum(w * h * 3 for w, h in zip(widths, heights))
        data = faces.data  # read once: each read of a bytes field copies it out of the message
        if len(data) != expected:
            raise InvalidMedia(f"{what}: sizes need {expected} bytes, got {len(data)}")
        return cls(widths, heights, data)

    def to_pb(self, frame_indices: Sequence[int], crop_indices: Sequence[int]) -> lipsync_pb2.GeneratedFaces:
        """The packed GeneratedFaces form, with each image's frame and crop index."""
        return lipsync_pb2.GeneratedFaces(
            frame_indices=frame_indices,
            crop_indices=crop_indices,
            widths=self.widths,
            heights=self.heights,
            data=self.data,
        )

    def nbytes(self) -> list[int]:
        """Bytes of each image."""
        return [w * h * 3 for w, h in zip(self.widths, self.heights)]

    def offsets(self) -> list[int]:
        """Where each image starts in `data`, and (last) the end of the last one: len(self) + 1 values."""
        return [0, *itertools.accumulate(self.nbytes())]

    def slice(self, start: int, end: int) -> PackedImages:
        """Images [start, end) (the object itself when that is all of them: no copy of the bytes)."""
        if (start, end) == (0, len(self)):
            return self
        offsets = self.offsets()
        return PackedImages(self.widths[start:end], self.heights[start:end], self.data[offsets[start] : offsets[end]])

    def items(self) -> list[tuple[int, int, bytes]]:
        """(width, height, bytes) per image, each image's bytes a copy (what a per-image proto field needs)."""
        offsets = self.offsets()
        return [(w, h, self.data[a:b]) for w, h, a, b in zip(self.widths, self.heights, offsets, offsets[1:])]

    def arrays(self) -> list[np.ndarray]:
        """(H, W, 3) uint8 views of the images, in order (no copy)."""
        flat = np.frombuffer(self.data, dtype=np.uint8)
        offsets = self.offsets()
        return [flat[a:b].reshape(h, w, 3) for w, h, a, b in zip(self.widths, self.heights, offsets, offsets[1:])]
