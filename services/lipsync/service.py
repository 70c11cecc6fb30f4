"""The lipsync stage's gRPC service: face detection for avatars, and lip-synced face generation."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import numpy as np
import torch
from torch import nn

from lipline.v1 import common_pb2, lipsync_pb2, lipsync_pb2_grpc
from services.inference.backends import Backend
from services.inference.request_bounds import check_items_per_message, check_output_bytes
from services.inference.stage import Keys, ModelStage, StageServicer, model_stream
from services.lipsync import prep
from services.lipsync.detect_stream import FaceStream
from services.lipsync.engine import MEL_SHAPE, GenerateChunk, LipSyncEngine
from services.lipsync.faces import DEFAULT_PADS, HaarFaceDetector
from services.lipsync.frames import FrameSequence
from services.lipsync.occlusion import OcclusionConfig
from services.lipsync.procedural import ProceduralLipSync
from services.lipsync.settings import LipSyncSettings
from services.lipsync.wav2lip import load_wav2lip
from services.media.packed import PackedImages
from services.media.wire import MAX_IMAGE_SIDE, image_from_proto, unpack_generate_items, unpack_speech
from services.serving.errors import FailedPrecondition, InvalidRequest

_LOGGER = logging.getLogger(__name__)
IMG = prep.IMG_SIZE


def check_pad_count(options: lipsync_pb2.DetectFacesOptions) -> tuple[int, int, int, int]:
    """DetectFacesOptions.pads as 4 numbers (the default when empty); INVALID_ARGUMENT otherwise."""
    pads = tuple(options.pads) if options.pads else DEFAULT_PADS
    if len(pads) != 4:
        raise InvalidRequest(f"pads must be 4 numbers (top, bottom, left, right), got {list(pads)}")
    return pads


def check_pads(pads: tuple[int, int, int, int], height: int, width: int) -> None:
    """Each pad within 0..the frame's height (top, bottom) or width (left, right).

    Why: a negative pad shrinks the box, and enough of it turns it inside out (pads of -10000 gave a
    degenerate box, not an error); a pad beyond the frame says nothing a clamp to the frame would not.
    """
    for name, value, side, what in zip(
        ("top", "bottom", "left", "right"), pads, (height, height, width, width), ("height", "height", "width", "width")
    ):
        if not 0 <= value <= side:
            raise InvalidRequest(f"pads.{name} is {value}; it must be in 0..{side} (the frame's {what}) pixels")


class LipSyncServicer(StageServicer["LipSyncService"], lipsync_pb2_grpc.LipSyncServiceServicer):
    async def DetectFaces(
        self, request_iterator: AsyncIterator[lipsync_pb2.DetectFacesRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[lipsync_pb2.DetectFacesResponse]:
        svc = self._service
        sequence = FrameSequence("DetectFaces", svc.settings.max_detect_frames)  # within the current sending
        options: lipsync_pb2.DetectFacesOptions | None = None
        stream: FaceStream | None = None
        held: list[np.ndarray] = []  # a client without options.resends: its frames, for a second check
        again = False  # receiving the second sending
        ended = False
        async for request in request_iterator:
            if options is None:
                options = request.options
                pads = check_pad_count(options)
                smooth = not options.no_smooth
            frames = sequence.take(request.frames, limited=not again)
            first_shape = sequence.shape
            if frames and first_shape is not None and stream is None:  # a frame sets first_shape
                check_pads(pads, first_shape[0], first_shape[1])
                if svc.detector is None:
                    raise FailedPrecondition("this lipsync replica runs without a face detector (--detector none)")
                stream = FaceStream(svc.detector.detect, pads, smooth, svc.occlusion)
            if frames and stream is not None:
                if again:
                    await asyncio.to_thread(stream.add_again, frames)
                else:
                    await asyncio.to_thread(stream.add, frames)
                    svc.metrics.items.labels(svc.stage).inc(len(frames))
                    if not options.resends:
                        held.extend(frames)
            if options.resends and request.end_of_frames:
                if stream is None:
                    raise InvalidRequest("DetectFaces received no frames")
                if again:
                    await asyncio.to_thread(stream.end_again)
                    ended = True
                    break
                if not await asyncio.to_thread(stream.end):
                    ended = True
                    break
                again = True
                sequence.restart()
                yield lipsync_pb2.DetectFacesResponse(send_again=True)
        if stream is None:
            raise InvalidRequest("DetectFaces received no frames")
        if not ended:
            if again:
                raise InvalidRequest(
                    f"the stream ended after {sequence.position} of the {stream.frame_count} frames sent again, without end_of_frames"
                )
            if await asyncio.to_thread(stream.end):
                if options is not None and options.resends:
                    raise InvalidRequest("the stream ended before the frames were sent again (send_again)")
                await asyncio.to_thread(stream.add_again, held)
                await asyncio.to_thread(stream.end_again)
        held.clear()
        assert stream.result is not None
        boxes, covered = stream.result
        found = sum(b is not None for b in boxes)
        _LOGGER.info(
            "detected faces", extra={"frames": len(boxes), "found": found, "mouth_covered": int(covered.sum())}
        )
        for start in range(0, len(boxes), 256):
            yield lipsync_pb2.DetectFacesResponse(
                faces=[
                    lipsync_pb2.FaceDetection(
                        index=i,
                        found=box is not None,
                        box=common_pb2.Box(**dict(zip(("x1", "y1", "x2", "y2"), box))) if box else None,
                        mouth_covered=bool(covered[i]),
                    )
                    for i, box in enumerate(boxes[start : start + 256], start)
                ]
            )

    async def Generate(
        self, request_iterator: AsyncIterator[lipsync_pb2.GenerateRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[lipsync_pb2.GenerateResponse]:
        svc = self._service
        bank = svc.engine.new_bank(svc.settings.max_crops_per_stream)

        paste: dict[int, tuple[int, int]] = {}

        def decode(request: lipsync_pb2.GenerateRequest) -> GenerateChunk | None:
            for crop in request.crops:
                size = (crop.paste_width or IMG, crop.paste_height or IMG)
                if max(size) > MAX_IMAGE_SIDE:  # at the edge, before it can reach a shared batch
                    raise InvalidRequest(
                        f"reference crop {crop.crop_index}: paste size {size[0]}x{size[1]} is above {MAX_IMAGE_SIDE} px per side"
                    )
                bank.add(crop.crop_index, image_from_proto(crop.image, f"reference crop {crop.crop_index}"))
                paste[crop.crop_index] = size
            check_items_per_message(len(request.items.frame_indices), svc.settings.max_pending_per_stream)
            frames, crops, mels = unpack_generate_items(request.items)
            if not len(frames):
                return None
            rows = bank.rows(crops, frames)
            sizes = None if request.raw_size else [paste[c] for c in crops.tolist()]
            check_output_bytes(sizes if sizes is not None else [(IMG, IMG)] * len(frames))
            return GenerateChunk(bank, rows, mels, sizes, unpack_speech(request.items))

        async def run(request: lipsync_pb2.GenerateRequest) -> tuple[Keys, PackedImages] | None:
            chunk = decode(request)  # in request order: crops of message k are known to k+1
            if chunk is None:
                return None
            faces = await svc.batcher.submit(chunk)
            return (list(request.items.frame_indices), list(request.items.crop_indices)), faces

        # One request message's faces may need several responses (at paste size a close-up face is
        # megabytes): cut by bytes, in item order, in the packed GeneratedFaces form.
        async for response in model_stream(
            request_iterator,
            run,
            generated_response,
            settings=svc.settings,
            model_info=svc.model_info,
            overhead=FACE_OVERHEAD,
            size_of=lambda r: len(r.items.frame_indices),
        ):
            yield response


# Field tags and varints of one face's frame index, crop index, width and height (at most 4 x 6 bytes).
FACE_OVERHEAD = 32


def generated_response(keys: Keys, faces: PackedImages) -> lipsync_pb2.GenerateResponse:
    """A run of one request message's faces (keys: their frame and crop indices) as one GenerateResponse."""
    frames, crops = keys
    return lipsync_pb2.GenerateResponse(faces=faces.to_pb(frames, crops))


class LipSyncService(ModelStage[LipSyncSettings, GenerateChunk]):
    stage = "lipsync"
    grpc_service = lipsync_pb2.DESCRIPTOR.services_by_name["LipSyncService"]

    def register(self, server: grpc.aio.Server) -> None:
        self.detector: HaarFaceDetector | None = None
        self.occlusion = OcclusionConfig.from_settings(self.settings)
        lipsync_pb2_grpc.add_LipSyncServiceServicer_to_server(LipSyncServicer(self), server)

    async def load(self) -> None:
        s = self.settings
        device, depth = self.prepare()
        model: nn.Module
        if s.checkpoint:
            model = await asyncio.to_thread(load_wav2lip, s.checkpoint)
            name = "wav2lip"
        else:
            model = ProceduralLipSync()
            name = "procedural"
            _LOGGER.warning(
                "no checkpoint configured: using the weight-free 'procedural' mouth animation, not Wav2Lip; "
                "set --checkpoint / LIPLINE_CHECKPOINT to a wav2lip.pth for real lip sync"
            )

        async def warm(backend: Backend) -> None:
            # One pass per warm-up batch of the spec (cuDNN algorithm search, CUDA graph capture,
            # compilation), largest first, through the same engine the requests use.
            self.engine = LipSyncEngine(backend, overlap=depth > 1)
            bank = self.engine.new_bank(1)
            bank.add(0, np.zeros((IMG, IMG, 3), np.uint8))
            for n in backend.spec.warmup_batches:
                chunk = GenerateChunk(bank, np.zeros(n, np.int64), np.full((n, *MEL_SHAPE), -4.0, np.float16), None)
                await asyncio.to_thread(self.engine.run, [chunk])

        gen = torch.Generator().manual_seed(0)
        guard_inputs = (torch.rand((8, 1, 80, 16), generator=gen) * 8 - 4, torch.rand((8, 6, IMG, IMG), generator=gen))
        # The procedural stand-in builds small host tensors per call: not safe to capture in a CUDA graph.
        self.backend = await self.start_model(
            device,
            model,
            warm,
            guard_inputs,
            precision=s.precision or None,
            cuda_graphs=None if name == "wav2lip" else False,
        )
        if s.detector == "haar":
            self.detector = HaarFaceDetector()
            await asyncio.to_thread(self.detector.detect, [np.zeros((64, 64, 3), np.uint8)])
        self.start_batcher(self.engine.run, depth, name, self.backend.name, self.backend.precision)
        _LOGGER.info(
            "lipsync ready",
            extra={"model": name, "backend": self.backend.describe(), "detector": s.detector, "pipeline_depth": depth},
        )
