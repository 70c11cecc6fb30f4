"""The superres stage's gRPC service: generated faces in, restored faces at their paste size out.

Each request message is one `UpscaleChunk` in the dynamic batcher (chunks of all streams share a
batch, a chunk is never split); `SuperResEngine.run` does the network, the LANCZOS4 resize to the
paste size and the uint8 conversion on the model's device and copies the bytes back once. The
images of one message go back in one or more responses, cut by bytes under the message limit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import grpc
import numpy as np
import torch

from lipline.v1 import common_pb2, superres_pb2, superres_pb2_grpc
from services.inference.backends import Backend
from services.inference.request_bounds import check_items_per_message, check_output_bytes
from services.inference.stage import Keys, ModelStage, StageServicer, model_stream
from services.media.packed import PackedImages
from services.media.wire import MAX_IMAGE_SIDE, image_from_proto
from services.serving.errors import InvalidRequest
from services.superres.engine import SuperResEngine, UpscaleChunk
from services.superres.settings import SuperResSettings
from services.superres.upscaler import ModelUpscaler, create_upscaler

_LOGGER = logging.getLogger(__name__)


class SuperResServicer(StageServicer["SuperResService"], superres_pb2_grpc.SuperResServiceServicer):
    async def Upscale(
        self, request_iterator: AsyncIterator[superres_pb2.UpscaleRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[superres_pb2.UpscaleResponse]:
        svc = self._service

        def decode(request: superres_pb2.UpscaleRequest) -> tuple[list[int], UpscaleChunk | None]:
            indices: list[int] = []
            crops: list[np.ndarray] = []
            sizes: list[tuple[int, int]] = []
            check_items_per_message(len(request.items), svc.settings.max_pending_per_stream)
            for item in request.items:
                crop = image_from_proto(item.image, f"item {item.index}")
                h, w = crop.shape[:2]
                out_w = item.out_width or w * svc.scale
                out_h = item.out_height or h * svc.scale
                if max(out_w, out_h, w, h) > MAX_IMAGE_SIDE:
                    raise InvalidRequest(f"item {item.index}: sizes above {MAX_IMAGE_SIDE} px are not supported")
                indices.append(item.index)
                crops.append(crop)
                sizes.append((out_w, out_h))
            check_output_bytes(sizes)
            return indices, UpscaleChunk.from_items(crops, sizes) if crops else None

        async def run(request: superres_pb2.UpscaleRequest) -> tuple[Keys, PackedImages]:
            indices, chunk = decode(request)
            # The whole message is one batcher item (never split): one result object back. An empty
            # message still gets one (empty) response.
            images = await svc.batcher.submit(chunk) if chunk is not None else _NO_IMAGES
            return (indices,), images

        # A message's images may need several responses (8 faces at 2048x2048 are 100 MB): cut by
        # bytes, in item order, each built only when it is sent.
        async for response in model_stream(
            request_iterator,
            run,
            upscale_response,
            settings=svc.settings,
            model_info=svc.model_info,
            overhead=ITEM_OVERHEAD,
        ):
            yield response


# Field tags and varints of one UpscaleItem around its image bytes (index, sizes, format, lengths).
ITEM_OVERHEAD = 64
_BGR24 = common_pb2.PIXEL_FORMAT_BGR24
_NO_IMAGES = PackedImages([], [], b"")


def upscale_response(keys: Keys, images: PackedImages) -> superres_pb2.UpscaleResponse:
    """A run of one request message's images (keys: their item indices) as one UpscaleResponse."""
    (indices,) = keys
    response = superres_pb2.UpscaleResponse()
    # Items are added in place (`add`, the image as a dict): building UpscaleItem/Image messages
    # first and passing them to a constructor copies each one again, image bytes included
    # (~170 vs ~15 us per 192x192 item, measured on a CPU).
    add = response.items.add
    for index, (w, h, data) in zip(indices, images.items()):
        add(index=index, image={"width": w, "height": h, "format": _BGR24, "data": data}, out_width=w, out_height=h)
    return response


class SuperResService(ModelStage[SuperResSettings, UpscaleChunk]):
    stage = "superres"
    grpc_service = superres_pb2.DESCRIPTOR.services_by_name["SuperResService"]

    def register(self, server: grpc.aio.Server) -> None:
        superres_pb2_grpc.add_SuperResServiceServicer_to_server(SuperResServicer(self), server)

    async def load(self) -> None:
        s = self.settings
        device, depth = self.prepare()
        # The network is loaded on the CPU in fp32 and stays there: the backend runs its own copy on
        # the device (the only one there), and these true fp32 weights are the numerics guard's
        # reference (a copy already rounded to fp16 would hide the rounding from the guard).
        self.upscaler = await asyncio.to_thread(create_upscaler, s.model, s.checkpoint or None, "cpu", torch.float32)
        self.scale = getattr(self.upscaler, "scale", 4)
        backend: Backend | None = None
        if isinstance(self.upscaler, ModelUpscaler):
            upscaler = self.upscaler

            async def warm(made: Backend) -> None:
                # All per-item maths on the backend's device, one copy back (SuperResEngine).
                self.engine = SuperResEngine(upscaler, device, max_batch=s.max_batch, backend=made, overlap=depth > 1)
                await self._warm_engine(made.spec.warmup_batches)

            guard_inputs = [torch.rand((4, 3, 96, 96), generator=torch.Generator().manual_seed(0))]
            backend = await self.start_model(device, upscaler.model, warm, guard_inputs)
            backend_name, precision = backend.name, backend.precision
        else:
            self.engine = SuperResEngine(self.upscaler, device, max_batch=s.max_batch, overlap=depth > 1)
            await self._warm_engine((1,))  # a resize only: no model batches to warm
            backend_name, precision = ("cpu" if device.type == "cpu" else "torch"), "fp32"
        self.start_batcher(self.engine.run, depth, self.upscaler.model_name, backend_name, precision)
        _LOGGER.info(
            "superres ready",
            extra={
                "model": self.upscaler.model_name,
                "device": str(device),
                "precision": precision,
                "backend": backend.describe() if backend is not None else backend_name,
                "resize": self.engine.resize,
                "pipeline_depth": depth,
            },
        )

    async def _warm_engine(self, batches: Sequence[int]) -> None:
        """The given batch sizes at the network's native size (96 px, no resize), then one resize."""
        for n in batches:
            await asyncio.to_thread(self.engine.warmup, n, (96, 96))
        await asyncio.to_thread(self.engine.warmup, 1, (96, 96), (150, 150))
