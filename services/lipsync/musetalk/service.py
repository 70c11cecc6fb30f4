"""The lipsync-musetalk stage's gRPC service (MuseTalkService): the 256 px tier in the MuseTalk 1.5
format, a second Deployment of the lipsync image (docs/architecture.md section 12).

Same shell as the Wav2Lip stage (`ModelStage`: device, backends, warm-up, numerics guard, the dynamic
batcher, `ModelInfo`, metrics, health): Generate streams are merged into model batches by the
batcher and run by `MuseTalkEngine`; two backends, the whisper encoder's and the generator's, each
with its own static batch buckets (fp16, channels_last and torch.compile with the compile cache on
CUDA; fp32 eager on the CPU). PrepareAvatar (services/lipsync/musetalk/prep.py) runs beside them, with
the Wav2Lip tier's covered-mouth check (services/lipsync/occlusion.py) over each avatar's frames.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import numpy as np
import torch

from lipline.v1 import common_pb2, lipsync_pb2, lipsync_pb2_grpc
from services.inference.backends import PRECISIONS, Backend
from services.inference.request_bounds import check_items_per_message, check_output_bytes
from services.inference.stage import Keys, ModelStage, StageServicer, model_stream
from services.lipsync.frames import FrameSequence
from services.lipsync.musetalk.dwpose import load_landmarker
from services.lipsync.musetalk.engine import MuseTalkChunk, MuseTalkEngine, StreamWindows
from services.lipsync.musetalk.face_parser import load_face_parser
from services.lipsync.musetalk.networks import load_networks, standin_networks
from services.lipsync.musetalk.prep import AvatarPreparer, PreparedFace
from services.lipsync.musetalk.settings import MuseTalkSettings
from services.lipsync.occlusion import OcclusionConfig, covered_from_features
from services.lipsync.service import FACE_OVERHEAD, generated_response
from services.media.musetalk_wire import (
    FACE_SIZE,
    LATENT_SHAPE,
    LOG_MEL_BANDS,
    WINDOW_COLUMNS,
    Window,
    unpack_items,
    unpack_latents,
    unpack_window,
)
from services.media.packed import PackedImages
from services.serving.errors import InvalidRequest
from services.serving.stages import STAGES

_LOGGER = logging.getLogger(__name__)
ENCODER_BUCKETS = (1, 2, 4, 8, 16)  # windows per encoder pass (those below max_windows_per_batch, then it)


def prepared_frame(index: int, face: PreparedFace | None) -> lipsync_pb2.PreparedFrame:
    if face is None:
        return lipsync_pb2.PreparedFrame(index=index, found=False)
    return lipsync_pb2.PreparedFrame(
        index=index,
        found=True,
        box=common_pb2.Box(**dict(zip(("x1", "y1", "x2", "y2"), face.box))),
        latents=face.latents.astype("<f2").tobytes(),
        mask_box=common_pb2.Box(**dict(zip(("x1", "y1", "x2", "y2"), face.mask_box))),
        mask=np.ascontiguousarray(face.mask, dtype=np.uint8).tobytes(),
    )


class MuseTalkServicer(StageServicer["MuseTalkService"], lipsync_pb2_grpc.MuseTalkServiceServicer):
    async def PrepareAvatar(
        self, request_iterator: AsyncIterator[lipsync_pb2.PrepareAvatarRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[lipsync_pb2.PrepareAvatarResponse]:
        """Each message's frames prepared and answered in order (no frame waits for another); once the
        requests end, the covered-mouth check over all of them (docs/architecture.md section 12.4, step 5)."""
        svc = self._service
        sequence = FrameSequence("PrepareAvatar", svc.settings.max_prepare_frames)
        lower_faces: list[np.ndarray | None] = []  # per frame (~9 KB with a face): what the check reads
        async for request in request_iterator:
            frames = sequence.take(request.frames)
            if not frames:
                continue
            prepared = await asyncio.to_thread(svc.preparer.prepare, frames)
            lower_faces.extend(None if face is None else face.lower_face for face in prepared)
            svc.metrics.items.labels(svc.stage).inc(len(frames))
            start = sequence.position - len(frames)
            response = lipsync_pb2.PrepareAvatarResponse(
                frames=[prepared_frame(start + k, face) for k, face in enumerate(prepared)]
            )
            if start == 0:
                response.model.CopyFrom(svc.preparer.model_info)
                response.box_source = svc.preparer.box_source
            yield response
        if sequence.position == 0:
            raise InvalidRequest("PrepareAvatar received no frames")
        covered = await asyncio.to_thread(covered_from_features, lower_faces, svc.occlusion)
        if covered.any():
            yield lipsync_pb2.PrepareAvatarResponse(mouth_covered=np.flatnonzero(covered).tolist())

    async def Generate(
        self, request_iterator: AsyncIterator[lipsync_pb2.MuseTalkGenerateRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[lipsync_pb2.GenerateResponse]:
        svc = self._service
        s = svc.settings
        bank = svc.engine.new_bank(s.max_latents_per_stream)
        windows = StreamWindows(s.max_window_positions)

        def decode(request: lipsync_pb2.MuseTalkGenerateRequest) -> MuseTalkChunk | None:
            """In request order (message k's latents and windows are known to k + 1), before anything
            reaches a shared batch: every size, index and range checked."""
            if request.HasField("latents"):
                bank.add(*unpack_latents(request.latents))
            for window in request.windows:
                windows.add(unpack_window(window))
            check_items_per_message(len(request.items.frame_indices), s.max_pending_per_stream)
            frames, latents, window_indices, offsets = unpack_items(request.items)
            if not len(frames):
                return None
            rows = bank.rows(latents, frames)
            check_output_bytes([(FACE_SIZE, FACE_SIZE)] * len(frames))
            return MuseTalkChunk(bank, rows, windows.resolve(frames, window_indices, offsets))

        async def run(request: lipsync_pb2.MuseTalkGenerateRequest) -> tuple[Keys, PackedImages] | None:
            chunk = decode(request)
            if chunk is None:
                return None
            faces = await svc.batcher.submit(chunk)
            return (list(request.items.frame_indices), list(request.items.latent_indices)), faces

        async for response in model_stream(
            request_iterator,
            run,
            generated_response,
            settings=s,
            model_info=svc.model_info,
            overhead=FACE_OVERHEAD,
            size_of=lambda r: len(r.items.frame_indices),
        ):
            yield response


def encoder_buckets(max_windows: int) -> tuple[int, ...]:
    return tuple(b for b in ENCODER_BUCKETS if b < max_windows) + (max_windows,)


class MuseTalkService(ModelStage[MuseTalkSettings, MuseTalkChunk]):
    stage = STAGES["lipsync-musetalk"].name
    grpc_service = lipsync_pb2.DESCRIPTOR.services_by_name["MuseTalkService"]

    def register(self, server: grpc.aio.Server) -> None:
        self.occlusion = OcclusionConfig.from_settings(self.settings)
        lipsync_pb2_grpc.add_MuseTalkServiceServicer_to_server(MuseTalkServicer(self), server)

    async def load(self) -> None:
        s = self.settings
        device, depth = self.prepare()
        if s.has_generator:
            self.networks = await asyncio.to_thread(
                load_networks, s.unet, s.unet_config, s.vae, s.whisper, s.fast_decode
            )
        else:
            self.networks = standin_networks()
            _LOGGER.warning(
                "no generator checkpoints configured: using the weight-free 'musetalk-standin' (a blurred face "
                "whose mouth opens with the audio's loudness), not MuseTalk; set unet, unet_config, vae and whisper"
            )
            if s.fast_decode:
                _LOGGER.warning("fast_decode has no effect on the stand-in (its decoder is a bicubic upsample)")
        nets = self.networks
        precision = s.precision or None
        graphs = None if not nets.standin else False  # the stand-in makes host tensors per call
        gen = torch.Generator().manual_seed(0)
        mel_guard = torch.rand((2, LOG_MEL_BANDS, WINDOW_COLUMNS), generator=gen) * 2 - 1.5
        encoder = await self.start_model(
            device,
            nets.encoder,
            self._warm_encoder,
            [mel_guard],
            precision=precision,
            cuda_graphs=graphs,
            compile_mode=s.compile_mode,
            buckets=encoder_buckets(s.max_windows_per_batch),
        )
        # (fp16 and channels_last: the backend casts the inputs; positional_encoding builds its table in the
        # tokens' dtype and device, the UNet's timestep is made on the latents' device, diffusers embeds it in
        # float32 and casts to the sample's dtype.)
        guard = (torch.randn((8, *LATENT_SHAPE), generator=gen) * 0.5, torch.rand((8, 50, 384), generator=gen))
        self.backend = await self.start_model(
            device,
            nets.generator,
            self._warm_generator,
            guard,
            precision=precision,
            cuda_graphs=graphs,
            compile_mode=s.compile_mode,
        )
        self.engine = MuseTalkEngine(encoder, self.backend, overlap=depth > 1)
        await asyncio.to_thread(self._warm_engine)
        self.preparer = await asyncio.to_thread(self._preparer, device, PRECISIONS[self.backend.precision])
        self.start_batcher(self.engine.run, depth, nets.name, self.backend.name, self.backend.precision)
        _LOGGER.info(
            "lipsync-musetalk ready",
            extra={"model": nets.name, "backend": self.backend.describe(), "encoder": encoder.describe()},
        )

    async def _warm_encoder(self, backend: Backend) -> None:
        """One pass per bucket of windows (compilation, CUDA graph capture), largest first."""
        await asyncio.to_thread(backend.warmup, lambda b: (torch.full((b, LOG_MEL_BANDS, WINDOW_COLUMNS), -1.5),))

    async def _warm_generator(self, backend: Backend) -> None:
        """One pass per warm-up batch of the spec (compilation, CUDA graph capture), largest first."""

        def example(b: int) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.zeros((b, *LATENT_SHAPE)), torch.zeros((b, 50, 384))

        await asyncio.to_thread(backend.warmup, example)

    def _preparer(self, device: torch.device, dtype: torch.dtype) -> AvatarPreparer:
        """PrepareAvatar's networks: the VAE (its encoder), and where configured BiSeNet and DWPose."""
        s = self.settings
        face_parser = load_face_parser(s.face_parser) if s.face_parser else None
        landmarker = load_landmarker(s.dwpose, device) if s.dwpose else None
        vae_name = self.networks.name if self.networks.standin else "sd-vae"
        preparer = AvatarPreparer(device, dtype, self.networks.vae, vae_name, face_parser, landmarker)
        preparer.prepare([np.zeros((64, 64, 3), np.uint8)])  # the detector's first call (no face: no networks)
        return preparer

    def _warm_engine(self) -> None:
        """One small batch through the whole engine (bank, windows, gather, copy back)."""
        bank = self.engine.new_bank(1)
        bank.add(np.zeros(1, np.int64), np.zeros((1, *LATENT_SHAPE), np.float16))
        windows = StreamWindows(WINDOW_COLUMNS)
        windows.add(Window(0, np.full((LOG_MEL_BANDS, 1), -1.5, np.float16), -1.5, 50, False))
        zero = np.zeros(1, np.int64)
        self.engine.run([MuseTalkChunk(bank, zero, windows.resolve(zero, zero, zero))])
