"""Clients of the three stage services, as the gateway uses them.

One aio channel per stage with explicit message limits and client-side round-robin over whatever
the address resolves to (in Kubernetes `dns:///<headless-service>:<port>` lists every ready pod;
`max_connection_age` on the servers makes clients re-resolve after a scale-up).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lipline.v1 import audio_pb2, audio_pb2_grpc, lipsync_pb2, lipsync_pb2_grpc, superres_pb2_grpc
from services.common.codec import image_to_proto
from services.common.errors import LiplineError
from services.common.server import channel_options
from services.common.tracing import outgoing_metadata
from services.lipsync.faces import Box

_LOGGER = logging.getLogger(__name__)

_SERVICE_CONFIG = json.dumps(
    {
        "loadBalancingConfig": [{"round_robin": {}}],
        # Transient UNAVAILABLE (a pod going away mid-scale-down) is retried on another replica.
        "methodConfig": [
            {
                "name": [{}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.2s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ],
    }
)


def grpc_target(address: str) -> str:
    """The gRPC target for a stage address setting: the discovery seam.

    - `host:port` -> as is (one replica);
    - `ip1:port1,ip2:port2,...` (a static list of IP addresses, e.g. one replica per local GPU) -> gRPC's
      `ipv4:` (or `ipv6:`) resolver, which hands every address to the round-robin balancer;
    - `dns:///name:port` (a Kubernetes headless Service: every ready pod) or any other scheme -> as is.
    """
    if "," not in address or ":///" in address or address.startswith(("ipv4:", "ipv6:", "unix:")):
        return address
    parts = [a.strip() for a in address.split(",") if a.strip()]
    scheme = "ipv6" if all(p.startswith("[") for p in parts) else "ipv4"
    return f"{scheme}:" + ",".join(parts)


def open_channel(address: str, max_message_bytes: int) -> grpc.aio.Channel:
    options = channel_options(max_message_bytes) + [
        ("grpc.service_config", _SERVICE_CONFIG),
        ("grpc.enable_retries", 1),
        ("grpc.keepalive_time_ms", 30_000),
    ]
    return grpc.aio.insecure_channel(grpc_target(address), options=options)


class StageClients:
    """Channels and stubs for the audio, lipsync and superres stages."""

    def __init__(self, audio: str, lipsync: str, superres: str, max_message_bytes: int) -> None:
        self.addresses = {"audio": audio, "lipsync": lipsync, "superres": superres}
        self.channels = {name: open_channel(addr, max_message_bytes) for name, addr in self.addresses.items()}
        self.audio = audio_pb2_grpc.AudioServiceStub(self.channels["audio"])
        self.lipsync = lipsync_pb2_grpc.LipSyncServiceStub(self.channels["lipsync"])
        self.superres = superres_pb2_grpc.SuperResServiceStub(self.channels["superres"])

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()

    async def check(self, stage: str, timeout: float = 2.0) -> bool:
        """True when the stage reports SERVING (used by the gateway's own readiness)."""
        stub = health_pb2_grpc.HealthStub(self.channels[stage])
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def detect_faces(
        self, frames: np.ndarray, request_id: str = "", per_message: int = 8, timeout: float | None = None
    ) -> list[Box | None]:
        """Detect (padded, smoothed) face boxes for every frame of an avatar."""

        async def requests() -> AsyncIterator[lipsync_pb2.DetectFacesRequest]:
            for start in range(0, len(frames), per_message):
                yield lipsync_pb2.DetectFacesRequest(
                    frames=[
                        lipsync_pb2.IndexedFrame(index=i, image=image_to_proto(frames[i]))
                        for i in range(start, min(start + per_message, len(frames)))
                    ]
                )

        boxes: list[Box | None] = [None] * len(frames)
        call = self.lipsync.DetectFaces(requests(), metadata=outgoing_metadata(request_id), timeout=timeout)
        async for response in call:
            for face in response.faces:
                if face.found:
                    boxes[face.index] = (face.box.x1, face.box.y1, face.box.x2, face.box.y2)
        return boxes

    def extract(
        self, audio: bytes, fps: float, request_id: str = "", chunk_bytes: int = 1 << 20
    ) -> AsyncIterator[audio_pb2.ExtractResponse]:
        async def requests() -> AsyncIterator[audio_pb2.ExtractRequest]:
            yield audio_pb2.ExtractRequest(options=audio_pb2.ExtractOptions(fps=fps), data=audio[:chunk_bytes])
            for start in range(chunk_bytes, len(audio), chunk_bytes):
                yield audio_pb2.ExtractRequest(data=audio[start : start + chunk_bytes])

        return self.audio.Extract(requests(), metadata=outgoing_metadata(request_id))


def stage_error_message(stage: str, exc: grpc.aio.AioRpcError) -> str:
    return f"{stage} stage failed ({exc.code().name}): {exc.details()}"


class StageFailed(LiplineError):
    """A stage answered a job's call with an error: keep its status code, name the stage."""

    def __init__(self, stage: str, exc: grpc.aio.AioRpcError) -> None:
        super().__init__(stage_error_message(stage, exc))
        self.code = exc.code()


@contextlib.asynccontextmanager
async def stage_errors(stage: str) -> AsyncIterator[None]:
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise StageFailed(stage, exc) from exc
