"""The lipsync stage's batch engine: reference crops live on the device, all per-frame maths runs there.

A Generate stream uploads its avatar's 96x96 reference crops once (a `CropBank` on the model's
device). Afterwards each request message is one `GenerateChunk`: crop indices, float16 mel windows
and the paste sizes; the dynamic batcher merges chunks from all streams, and `LipSyncEngine.run`
does the whole batch on the device in one pass: gather crops, build the 6-channel input (masked
lower half + reference, /255), run the generator, convert to uint8 with upstream's truncation, resize
to paste size (bilinear, like cv2.INTER_LINEAR); `DeviceBatchEngine` copies the bytes back once.
On a CPU the same code runs with CPU tensors (what CI exercises).

Why: on a GPU the host-side numpy path (mostly building the float32 6-channel input) capped the
service at a tenth of what the model does (docs/performance.md); uploading uint8 crops once and
doing the maths on the device removes that host work.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from services.inference.backends import Backend
from services.inference.bank import DeviceBank
from services.inference.engine import DeviceBatchEngine, Part, group_rows_by_size
from services.lipsync.prep import IMG_SIZE, model_inputs_torch
from services.media.wire import MEL_BANDS, MEL_STEP
from services.serving.errors import InvalidRequest

MEL_SHAPE = (MEL_BANDS, MEL_STEP)


def _resize(faces: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """(n, 96, 96, 3) uint8 -> (n, height, width, 3) uint8, bilinear like cv2.INTER_LINEAR."""
    if (width, height) == (IMG_SIZE, IMG_SIZE):
        return faces
    resized = F.interpolate(
        faces.permute(0, 3, 1, 2).float(), size=(height, width), mode="bilinear", align_corners=False
    )
    return resized.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)


class CropBank(DeviceBank):
    """One stream's reference crops, uploaded once, as a (N, 96, 96, 3) uint8 tensor on the device."""

    def __init__(self, device: torch.device, max_crops: int) -> None:
        super().__init__(device, (IMG_SIZE, IMG_SIZE, 3), torch.uint8, max_crops, "crop", "reference crops")

    def add(self, crop_index: int, face: np.ndarray) -> None:
        """Register crop `crop_index` (a (96, 96, 3) uint8 BGR array); re-sending an index replaces it."""
        if face.shape != (IMG_SIZE, IMG_SIZE, 3):
            raise InvalidRequest(
                f"reference crop {crop_index} is {face.shape[1]}x{face.shape[0]}; send {IMG_SIZE}x{IMG_SIZE}"
            )
        self.put((crop_index,), (face,))


@dataclasses.dataclass
class GenerateChunk:
    """The items of one request message: what the batcher queues (never split across batches)."""

    bank: CropBank
    rows: np.ndarray  # (n,) int64 rows of `bank`
    mels: np.ndarray  # (n, 80, 16) float16
    sizes: list[tuple[int, int]] | None  # per item (width, height) to resize to; None = 96x96
    speech: np.ndarray | None = None  # (n,) float32 clip speech envelope in [0, 1]; None = not sent

    def __len__(self) -> int:
        return len(self.rows)


class LipSyncEngine(DeviceBatchEngine[GenerateChunk]):
    """Runs merged batches of chunks through a generator backend, on the backend's device."""

    def __init__(self, backend: Backend, overlap: bool = False) -> None:
        """
        Args:
            backend: the generator backend.
            overlap: use per-thread CUDA streams so concurrent batches overlap (the batcher's
                concurrency > 1; the service turns it on with pipeline_depth > 1, by default on
                CUDA; docs/performance.md has the measurement). Off (and always on the CPU)
                everything runs on the current stream; the network call is under a lock either way.
        """
        super().__init__(backend.device, overlap)
        self.backend = backend
        # A model that opens the mouth by the clip's speech envelope (the procedural one) takes it as a
        # third input, NaN where a client sent none; models with weights take the two upstream inputs.
        self.reads_speech = bool(getattr(getattr(backend, "module", None), "reads_speech", False))

    def new_bank(self, max_crops: int) -> CropBank:
        return CropBank(self.device, max_crops)

    def process(self, chunks: list[GenerateChunk]) -> list[Part]:
        """One model batch for all chunks, its faces resized to their paste sizes, grouped by size.

        On a GPU each batch thread uploads, prepares, resizes and copies back on its own CUDA
        stream (`DeviceBatchEngine.run`), while the model itself runs on one compute stream under a
        lock (CUDA graphs reuse static buffers), so batch k+1's transfers and host work overlap
        batch k's compute.
        """
        mels = np.concatenate([c.mels for c in chunks])
        mel_t = torch.from_numpy(mels)
        if self._pin:
            mel_t = mel_t.pin_memory()
        mel_t = mel_t.to(self.device, non_blocking=True).to(torch.float32).unsqueeze(1)
        faces = torch.cat([c.bank.tensor()[torch.from_numpy(c.rows).to(self.device)] for c in chunks])
        x = model_inputs_torch(faces)  # prep.model_inputs' maths, on the device
        inputs = [mel_t, x]
        if self.reads_speech:
            speech = np.concatenate(
                [np.full(len(c), np.nan, np.float32) if c.speech is None else c.speech for c in chunks]
            )
            inputs.append(torch.from_numpy(speech).to(self.device))
        with self.streams.compute():
            pred = self.backend.forward_device(*inputs)
            # upstream: (p * 255).astype(uint8) -> truncation toward zero; clamp keeps it from
            # wrapping. Done on the compute stream, before the next replay reuses `pred`'s buffer.
            out = (pred.float() * 255.0).clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        if self.streams.enabled:
            out.record_stream(torch.cuda.current_stream(self.device))  # made there, read here
        sizes = [size for chunk in chunks for size in (chunk.sizes or [(IMG_SIZE, IMG_SIZE)] * len(chunk))]
        ordered, groups = group_rows_by_size(out, sizes, self._pin)  # a photo avatar: one group, no gather
        parts: list[Part] = []
        start = 0
        for (w, h), positions in groups:
            parts.append((positions, _resize(ordered[start : start + len(positions)], w, h)))
            start += len(positions)
        return parts
