"""FaceLink's lipsync-musetalk stream (the musetalk tier's live sessions) against the real stage (its
weight-free stand-in, its own process on 127.0.0.1), with each utterance's whisper windows made by
services.live.whisper_stream from real speech."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import grpc
import numpy as np
import pytest

from lipline.v1 import lipsync_pb2, lipsync_pb2_grpc
from services.live.face_link import FaceLink, FaceLinkSettings, ReferenceFace, ReferenceLatent
from services.live.whisper_stream import WhisperStream
from services.local.cluster import LOCAL_FLAGS
from services.local.process import ServiceProcess, start
from services.media.audio import decode_audio
from services.serving.channels import open_channel
from services.serving.errors import FailedPrecondition, InvalidRequest
from tests.integration.util import SAMPLES

LATENT_SCALE = 0.18215


def latent_of(bgr: tuple[int, int, int], paste: tuple[int, int] = (150, 170)) -> ReferenceLatent:
    """Latents the stand-in decodes to a face of one colour: its 'VAE' means are [-1, 1] RGB x 0.18215."""
    rgb = (np.array(bgr[::-1], np.float32) / 255.0 - 0.5) / 0.5
    latents = np.zeros((8, 32, 32), np.float32)
    latents[4:7] = rgb[:, None, None] * LATENT_SCALE
    latents[0:3] = rgb[:, None, None] * LATENT_SCALE
    return ReferenceLatent(latents.astype(np.float16), *paste)


@pytest.fixture(scope="module")
def musetalk_stage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    workdir = tmp_path_factory.mktemp("lipsync-musetalk")
    process = start("lipsync-musetalk", "lipsync-musetalk", ["--device=cpu"], workdir, base_args=LOCAL_FLAGS)
    try:
        process.wait_ready(180)
        yield process
    finally:
        process.kill()


@pytest.fixture(scope="module")
def utterance() -> WhisperStream:
    stream = WhisperStream(16000, 25.0)
    speech = decode_audio((SAMPLES / "speech.wav").read_bytes(), 16000)[: 16000 * 2]
    stream.push(speech.astype(np.float64))
    stream.finish()
    return stream


class Recorder(lipsync_pb2_grpc.MuseTalkServiceStub):
    """The stage's stub, keeping every request message the link writes."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__(channel)
        self.requests: list[lipsync_pb2.MuseTalkGenerateRequest] = []
        generate = self.Generate

        def recording(metadata: tuple = ()) -> object:
            call = generate(metadata=metadata)
            write = call.write

            async def write_and_keep(request: lipsync_pb2.MuseTalkGenerateRequest) -> None:
                self.requests.append(request)
                await write(request)

            call.write = write_and_keep  # type: ignore[method-assign]
            return call

        self.Generate = recording  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def linked(address: str) -> AsyncIterator[tuple[FaceLink, Recorder]]:
    channel = open_channel(address, 64 * 2**20)
    stub = Recorder(channel)
    link = FaceLink(
        lipsync_pb2_grpc.LipSyncServiceStub(channel),
        None,
        FaceLinkSettings(flush_interval_s=0.05, default_due_s=20.0),
        musetalk=stub,
    )
    try:
        async with link:
            yield link, stub
    finally:
        await channel.close()


def test_sessions_of_the_tier_share_one_stream_latents_once_and_a_window_per_session(
    musetalk_stage: ServiceProcess, utterance: WhisperStream
) -> None:
    async def main() -> None:
        async with linked(musetalk_stage.address) as (link, stub):
            colours = [(60, 120, 200), (200, 90, 40)]
            link.register("a", [latent_of(colours[0]), latent_of(colours[1])], shared_as="avatar-1")
            link.register("b", [latent_of(colours[0]), latent_of(colours[1])], shared_as="avatar-1")
            link.register("c", [latent_of((30, 160, 90), (100, 120))])
            faces = await asyncio.gather(
                *(
                    link.submit_musetalk(session, frame, crop, utterance, frame)
                    for frame in (10, 11)
                    for session, crop in (("a", 0), ("b", 1), ("c", 0))
                )
            )
            assert all(face.shape == (256, 256, 3) and face.dtype == np.uint8 for face in faces)
            # the stand-in decodes each latent to its colour (outside the mouth it draws)
            for face, colour in zip(faces, [colours[0], colours[1], (30, 160, 90)] * 2):
                assert np.abs(face[20:100, 20:236].astype(int) - colour).mean() < 6, colour
            assert link.models["lipsync-musetalk"]["name"] == "musetalk-standin"
            banks = [r.latents for r in stub.requests if r.HasField("latents")]
            assert sum(len(b.latent_indices) for b in banks) == 3  # avatar-1's two latents once, c's one
            messages = [r for r in stub.requests if r.items.frame_indices]
            for message in messages:  # one window per session in the message, each its own index
                sessions = len(set(message.items.window_indices))
                assert len(message.windows) == sessions == len({w.window_index for w in message.windows})
                assert list(message.items.offsets) == [2 * f - 4 for f in message.items.frame_indices]
            assert sum(len(m.items.frame_indices) for m in messages) == 6
            assert link.counters.faces == 6 and link.counters.failed == 0

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_session_of_one_tier_cannot_use_the_others_calls(musetalk_stage: ServiceProcess) -> None:
    async def main() -> None:
        async with linked(musetalk_stage.address) as (link, _):
            link.register("m", [latent_of((1, 2, 3))])
            link.register("w", [ReferenceFace(np.zeros((96, 96, 3), np.uint8), 100, 100)])
            with pytest.raises(InvalidRequest, match="musetalk tier: use submit_musetalk"):
                link.submit("m", 0, 0, np.zeros((80, 16), np.float32))
            with pytest.raises(InvalidRequest, match="wav2lip tier: use submit"):
                link.submit_musetalk("w", 0, 0, WhisperStream(16000, 25.0), 0)
            with pytest.raises(InvalidRequest, match=r"latents 0 are float32 \(8, 32, 32\)"):
                link.register("bad", [ReferenceLatent(np.zeros((8, 32, 32), np.float32), 10, 10)])
        channel = open_channel(musetalk_stage.address, 2**20)
        try:
            async with FaceLink(lipsync_pb2_grpc.LipSyncServiceStub(channel)) as plain:
                with pytest.raises(FailedPrecondition, match="no lipsync-musetalk stage"):
                    plain.register("m", [latent_of((1, 2, 3))])
        finally:
            await channel.close()

    asyncio.run(asyncio.wait_for(main(), 60))
