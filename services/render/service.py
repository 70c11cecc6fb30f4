"""The render worker service: one process, one task at a time; scale with processes and pods.

It serves no API, only gRPC health (SERVING once the stages answer and the stores are open, and
NOT_SERVING again while its claim loop has ended or stalled: a liveness probe then restarts it) and
/metrics, through the same bootstrap as every lipline service. Beside its claim loop it runs the
janitor (services.render.janitor; one worker at a time sweeps). SIGTERM: stop claiming, give the
janitor's lease up, finish the current task within `grace_s` or give it back, exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from lipline.v1 import lipsync_pb2_grpc, superres_pb2_grpc
from services.jobs.avatar_cache import AvatarCache
from services.jobs.store import close_stores, open_stores
from services.render.encoder_threads import x264_threads
from services.render.janitor import Janitor
from services.render.segment import SegmentRenderer
from services.render.settings import RenderSettings
from services.render.tasks import RenderTasks
from services.render.worker import RenderWorker
from services.serving.discovery import DiscoveredStageClients
from services.serving.server import Service

_LOGGER = logging.getLogger(__name__)
QUEUE_STATS_EVERY_S = 2.0
WATCHDOG_EVERY_S = 1.0


class RenderService(Service[RenderSettings]):
    stage = "render"

    @property
    def service_names(self) -> Sequence[str]:
        return []  # health ("") and reflection only

    def register(self, server: grpc.aio.Server) -> None:
        self._loops: list[asyncio.Task] = []

    async def load(self) -> None:
        s = self.settings
        # Both final statuses a worker counts exported from the start (0): LiplineJobsFailing's failed
        # share is then 0, not nothing, until the first failure.
        for status in ("succeeded", "failed"):
            self.metrics.jobs.labels(status)
        self.jobs, self.blobs = await open_stores(s)
        # Each stage's channel follows its replicas (k8s:///, file://; static and dns:/// as before).
        # The musetalk tier's stage is optional (an empty address: not deployed) and not waited for:
        # only that tier's jobs need it.
        addresses = {"lipsync": s.lipsync_address, "superres": s.superres_address}
        if s.lipsync_musetalk_address:
            addresses["lipsync-musetalk"] = s.lipsync_musetalk_address
        self.clients = DiscoveredStageClients(addresses, s.max_message_bytes)
        await self.clients.start()
        await self.clients.wait_serving(s.stage_wait_s, stages=("lipsync", "superres"))
        clients = self.clients
        threads = s.x264_threads or x264_threads()
        self.renderer = SegmentRenderer(
            lambda: clients.stub("lipsync", lipsync_pb2_grpc.LipSyncServiceStub),  # a fresh stub per segment
            lambda: clients.stub("superres", superres_pb2_grpc.SuperResServiceStub),
            self.metrics,
            s.x264_preset,
            threads,
            s.encode_nice,
            musetalk=(lambda: clients.stub("lipsync-musetalk", lipsync_pb2_grpc.MuseTalkServiceStub))
            if s.lipsync_musetalk_address
            else None,
        )
        name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        cache = AvatarCache(self.blobs, Path(s.cache_dir), max_bytes=s.avatar_cache_bytes)
        tasks = RenderTasks(
            self.metrics, self.jobs, self.blobs, cache, self.renderer, Path(s.cache_dir) / "scratch", s.output_ttl_s
        )
        self.worker = RenderWorker(s, self.metrics, self.jobs, self.blobs, tasks, name)
        self.janitor = Janitor(s, self.metrics, self.jobs, self.blobs, name)
        self.janitor.start()
        self._loops = [
            asyncio.create_task(self.worker.run(), name="render-loop"),
            asyncio.create_task(self._export_queue_stats(), name="queue-stats"),
            asyncio.create_task(self._watch_loop(), name="render-watchdog"),
        ]
        _LOGGER.info("render worker ready", extra={"worker": name, "x264_threads": threads, "preset": s.x264_preset})

    async def _export_queue_stats(self) -> None:
        m = self.metrics
        while True:
            with contextlib.suppress(Exception):
                q = await asyncio.to_thread(self.jobs.queue_stats)
                m.queue_tasks.labels("segment").set(q.waiting)
                m.queue_leased.set(q.leased)
                m.queue_oldest_seconds.set(q.oldest_wait_s)
            await asyncio.sleep(QUEUE_STATS_EVERY_S)

    async def _watch_loop(self) -> None:
        """Health follows the claim loop: NOT_SERVING (and the gauge 0, and an ERROR line saying why)
        while it has ended or stalled, SERVING again if it moves again. Why: a process whose loop died
        used to stay up and SERVING, so nothing restarted it."""
        m, worker = self.metrics, self.worker
        m.render_loop_healthy.set(1)
        healthy = True
        while not worker.stopping:
            await asyncio.sleep(WATCHDOG_EVERY_S)
            m.render_loop_age_seconds.set(max(0.0, time.monotonic() - worker.last_beat))
            problem = worker.loop_health()
            if worker.stopping or bool(problem) != healthy:
                continue
            healthy = not problem
            m.render_loop_healthy.set(1 if healthy else 0)
            if problem:
                _LOGGER.error(
                    "render worker unhealthy: %s; health reports NOT_SERVING", problem, extra={"worker": worker.name}
                )
            else:
                _LOGGER.info(
                    "render worker's claim loop moves again; health reports SERVING", extra={"worker": worker.name}
                )
            if self.health is not None:
                status = (
                    health_pb2.HealthCheckResponse.SERVING if healthy else health_pb2.HealthCheckResponse.NOT_SERVING
                )
                await self.health.set("", status)

    async def close(self) -> None:
        if hasattr(self, "janitor"):
            await self.janitor.close()
        if hasattr(self, "worker"):
            await self.worker.drain(self.settings.grace_s)
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        if hasattr(self, "renderer"):
            await asyncio.to_thread(self.renderer.close)
        if hasattr(self, "clients"):
            await self.clients.close()
        close_stores(getattr(self, "jobs", None), getattr(self, "blobs", None))
