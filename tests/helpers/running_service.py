"""A stage's service on 127.0.0.1:<ephemeral>, its event loop in a thread of its own, for unit tests
that call it through a blocking gRPC channel (the service's own server and interceptors, no cluster)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import grpc

from services.serving.server import ServiceRunner


class RunningService:
    """Enter: the service built by `build()` (inside its loop) is SERVING; `channel` reaches it."""

    def __init__(self, build: Callable[[], Any], name: str, start_timeout_s: float = 60.0) -> None:
        self._build = build
        self._start_timeout_s = start_timeout_s
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)

    def __enter__(self) -> grpc.Channel:
        self.thread.start()

        async def start() -> ServiceRunner:
            runner = ServiceRunner(self._build())
            await runner.start()
            return runner

        self.runner = asyncio.run_coroutine_threadsafe(start(), self.loop).result(self._start_timeout_s)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.runner.port}")
        return self.channel

    def __exit__(self, *exc: object) -> None:
        self.channel.close()
        asyncio.run_coroutine_threadsafe(self.runner.stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
