"""The lipsync stage's gRPC service: face detection for avatars, and lip-synced face generation."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence

import grpc
import numpy as np
import torch
from torch import nn

from lipline.v1 import common_pb2, lipsync_pb2, lipsync_pb2_grpc
from services.common.backends import TorchBackend, make_backend
from services.common.batcher import DynamicBatcher
from services.common.codec import image_from_proto, image_to_proto, mel_from_bytes
from services.common.config import ServiceSettings, _field
from services.common.device import cudnn_self_check, resolve_device
from services.common.errors import InvalidRequest, TooLarge
from services.common.server import Service
from services.common.streams import ordered_stream
from services.lipsync import prep
from services.lipsync.faces import DEFAULT_PADS, HaarFaceDetector, prepare_boxes
from services.lipsync.procedural import ProceduralLipSync
from services.lipsync.wav2lip import load_wav2lip

_LOGGER = logging.getLogger(__name__)
IMG = prep.IMG_SIZE

# One queued generation: reference face (96, 96, 3) uint8, mel window (80, 16), paste size or None.
GenerateJob = tuple[np.ndarray, np.ndarray, tuple[int, int] | None]


@dataclasses.dataclass(frozen=True)
class LipSyncSettings(ServiceSettings):
    """Settings of the lipsync service."""

    port: int = _field(50062, "gRPC port")
    metrics_port: int = _field(9092, "Prometheus /metrics HTTP port (0 = any free port, -1 = off)")
    checkpoint: str = _field("", "wav2lip.pth / wav2lip_gan.pth; empty = the weight-free 'procedural' model")
    max_batch: int = _field(128, "largest model batch (Wav2Lip's inference default)")
    max_delay_ms: float = _field(5.0, "how long a batch waits to fill up")
    max_pending_per_stream: int = _field(512, "items one stream may have in flight (back-pressure)")
    max_crops_per_stream: int = _field(4096, "reference crops one Generate stream may register")
    max_detect_frames: int = _field(3000, "frames one DetectFaces stream may send")
    backend: str = _field(
        "auto", "model backend: auto (CUDA: torch fp16 + folded BN + CUDA graphs; CPU: cpu), cpu, torch, compile, tensorrt"
    )
    precision: str = _field("", "fp32, fp16 or bf16; empty = the backend's default (fp16 on CUDA, fp32 on CPU)")
    batch_buckets: tuple[int, ...] = _field(
        (), "batch sizes a model batch is padded up to (static shapes for CUDA graphs/compile); empty = default up to max_batch"
    )


def generate_batch(backend: TorchBackend, jobs: list[GenerateJob]) -> list[np.ndarray]:
    """Run one merged batch through the generator and return uint8 BGR faces at their paste size."""
    faces = torch.from_numpy(prep.model_inputs(np.stack([j[0] for j in jobs])))
    mels = torch.from_numpy(prep.mel_inputs(np.stack([j[1] for j in jobs])))
    pred = prep.to_uint8_faces(backend(mels, faces).numpy())
    return [face if size is None else prep.resize_to(face, *size) for face, (_, _, size) in zip(pred, jobs)]


class LipSyncServicer(lipsync_pb2_grpc.LipSyncServiceServicer):
    def __init__(self, service: LipSyncService) -> None:
        self._service = service

    async def DetectFaces(
        self, request_iterator: AsyncIterator[lipsync_pb2.DetectFacesRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[lipsync_pb2.DetectFacesResponse]:
        svc = self._service
        options: lipsync_pb2.DetectFacesOptions | None = None
        indices: list[int] = []
        frames: list[np.ndarray] = []
        async for request in request_iterator:
            if options is None:
                options = request.options
            for item in request.frames:
                if len(frames) >= svc.settings.max_detect_frames:
                    raise TooLarge(f"more than {svc.settings.max_detect_frames} frames in one DetectFaces stream")
                frames.append(image_from_proto(item.image, f"frame {item.index}"))
                indices.append(item.index)
        if not frames:
            raise InvalidRequest("DetectFaces received no frames")
        shapes = {f.shape for f in frames}
        if len(shapes) > 1:
            raise InvalidRequest(f"all frames of one stream must have the same size, got {sorted(shapes)[:3]}")
        pads = tuple(options.pads) if options is not None and options.pads else DEFAULT_PADS
        if len(pads) != 4:
            raise InvalidRequest(f"pads must be 4 numbers (top, bottom, left, right), got {list(pads)}")
        smooth = not (options is not None and options.no_smooth)
        h, w = frames[0].shape[:2]
        raw = await asyncio.to_thread(svc.detector.detect, frames)
        boxes = prepare_boxes(raw, h, w, pads, smooth)
        svc.metrics.items.labels(svc.stage).inc(len(frames))
        found = sum(b is not None for b in boxes)
        _LOGGER.info("detected faces", extra={"frames": len(frames), "found": found})
        for start in range(0, len(boxes), 256):
            yield lipsync_pb2.DetectFacesResponse(
                faces=[
                    lipsync_pb2.FaceDetection(
                        index=indices[i],
                        found=boxes[i] is not None,
                        box=common_pb2.Box(**dict(zip(("x1", "y1", "x2", "y2"), boxes[i]))) if boxes[i] else None,
                    )
                    for i in range(start, min(start + 256, len(boxes)))
                ]
            )

    async def Generate(
        self, request_iterator: AsyncIterator[lipsync_pb2.GenerateRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[lipsync_pb2.GenerateResponse]:
        svc = self._service
        crops: dict[int, tuple[np.ndarray, tuple[int, int]]] = {}

        def decode(request: lipsync_pb2.GenerateRequest) -> tuple[list[lipsync_pb2.GenerateItem], list[GenerateJob]]:
            for crop in request.crops:
                face = image_from_proto(crop.image, f"reference crop {crop.crop_index}")
                if face.shape != (IMG, IMG, 3):
                    raise InvalidRequest(f"reference crop {crop.crop_index} is {face.shape[1]}x{face.shape[0]}; send {IMG}x{IMG}")
                if len(crops) >= svc.settings.max_crops_per_stream and crop.crop_index not in crops:
                    raise TooLarge(f"more than {svc.settings.max_crops_per_stream} reference crops in one stream")
                crops[crop.crop_index] = (face, (crop.paste_width or IMG, crop.paste_height or IMG))
            jobs: list[GenerateJob] = []
            for item in request.items:
                if item.crop_index not in crops:
                    raise InvalidRequest(
                        f"item for frame {item.frame_index} names crop {item.crop_index}, which this stream has not sent"
                    )
                face, paste = crops[item.crop_index]
                mel = mel_from_bytes(item.mel.data, f"mel window of frame {item.frame_index}")
                jobs.append((face, mel, None if request.raw_size else paste))
            return list(request.items), jobs

        async def run(request: lipsync_pb2.GenerateRequest) -> lipsync_pb2.GenerateResponse | None:
            items, jobs = decode(request)  # in request order: crops of message k are known to k+1
            if not jobs:
                return None
            faces = await svc.batcher.submit_many(jobs)
            return lipsync_pb2.GenerateResponse(
                faces=[
                    lipsync_pb2.GeneratedFace(frame_index=it.frame_index, crop_index=it.crop_index, image=image_to_proto(f))
                    for it, f in zip(items, faces)
                ]
            )

        first = True
        async for response in ordered_stream(request_iterator, run, svc.settings.max_pending_per_stream):
            if first:
                response.model.CopyFrom(svc.model_info)
                first = False
            yield response


class LipSyncService(Service[LipSyncSettings]):
    stage = "lipsync"

    @property
    def service_names(self) -> Sequence[str]:
        return [lipsync_pb2.DESCRIPTOR.services_by_name["LipSyncService"].full_name]

    def register(self, server: grpc.aio.Server) -> None:
        lipsync_pb2_grpc.add_LipSyncServiceServicer_to_server(LipSyncServicer(self), server)

    async def load(self) -> None:
        s = self.settings
        device = resolve_device(s.device)
        ok, detail = cudnn_self_check(device)
        self.metrics.cudnn_ok.labels(self.stage).set(1 if ok else 0)
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
        self.backend = make_backend(
            s.backend, model, device, precision=s.precision or None, batch_buckets=s.batch_buckets or None,
            max_batch=s.max_batch,
            # The procedural stand-in builds small host tensors per call: not safe to capture in a CUDA graph.
            cuda_graphs=None if name == "wav2lip" else False,
        )
        if self.backend.batch_buckets:  # one pass per bucket: cuDNN algorithms, CUDA graphs, compilation
            await asyncio.to_thread(
                self.backend.warmup, lambda b: (torch.full((b, 1, 80, 16), -4.0), torch.zeros((b, 6, IMG, IMG)))
            )
        self.model_info = common_pb2.ModelInfo(name=name, backend=self.backend.name, precision=self.backend.precision)
        self.detector = HaarFaceDetector()
        warm: list[GenerateJob] = [(np.zeros((IMG, IMG, 3), np.uint8), np.full((80, 16), -4.0, np.float32), None)] * 2
        await asyncio.to_thread(generate_batch, self.backend, warm)
        await asyncio.to_thread(self.detector.detect, [np.zeros((64, 64, 3), np.uint8)])
        self.batcher: DynamicBatcher[GenerateJob, np.ndarray] = DynamicBatcher(
            lambda jobs: generate_batch(self.backend, jobs), self.metrics, s.max_batch, s.max_delay_ms / 1000
        )
        self.batcher.start()
        self.metrics.set_backend(name, self.backend.name, self.backend.precision)
        _LOGGER.info("lipsync ready", extra={"model": name, "device": str(device), "cudnn": detail})

    async def close(self) -> None:
        if hasattr(self, "batcher"):
            await self.batcher.close()
