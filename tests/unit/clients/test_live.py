"""LiveSession's frame acknowledgements (issue 29): it asks for an ack window of about a second of
frames, acknowledges a frame when the consumer takes it (never when it only arrived), and
acknowledges the frames it drops after a Clear, so a window full of them cannot stall the stream.
A real grpc.aio server in this process stands in for the gateway."""

from __future__ import annotations

import asyncio

import grpc

from lipline_client.live import LiveSession
from lipline_client.v1 import gateway_pb2_grpc, session_pb2

FPS = 25.0


class FramingGateway(gateway_pb2_grpc.GatewayServicer):
    """Converse: Ready, then the frames `script` says (speech or idle), each once asked for with `go`;
    every request the client sends is kept."""

    def __init__(self, speech: list[bool]) -> None:
        self.speech = speech
        self.requests: list[session_pb2.ConverseRequest] = []
        self.go = asyncio.Queue[int]()

    async def Converse(self, request_iterator, context):  # type: ignore[no-untyped-def]
        async def keep() -> None:
            async for request in request_iterator:
                self.requests.append(request)

        reader = asyncio.create_task(keep())
        yield session_pb2.ConverseResponse(ready=session_pb2.Ready(next_frame=0))
        index = 0
        while index < len(self.speech):
            for _ in range(await self.go.get()):
                frame = session_pb2.VideoFrame(index=index, speech=self.speech[index], audio=bytes(1280))
                yield session_pb2.ConverseResponse(frame=frame)
                index += 1
        await reader

    def acks(self) -> list[int]:
        return [r.ack.frame for r in self.requests if r.WhichOneof("request") == "ack"]


async def eventually(check, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {what} within 10 s")


async def session_on(gateway: FramingGateway) -> tuple[grpc.aio.Server, LiveSession]:
    server = grpc.aio.server()
    gateway_pb2_grpc.add_GatewayServicer_to_server(gateway, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    session = session_pb2.Session(id="s1", resume_token="t", video=session_pb2.VideoFormat(fps=FPS))
    return server, LiveSession(channel, session, ())


def test_frames_are_acknowledged_as_the_consumer_takes_them() -> None:
    async def scenario() -> None:
        gateway = FramingGateway([False] * 6)
        server, live = await session_on(gateway)
        try:
            assert isinstance(await anext(live), session_pb2.Ready)
            await eventually(lambda: gateway.requests, "ConverseStart")
            assert gateway.requests[0].start.ack_window == 50  # two seconds of frames at 25 fps
            gateway.go.put_nowait(6)
            taken = [await anext(live), await anext(live)]
            assert [f.index for f in taken] == [0, 1]
            await eventually(lambda: gateway.acks() and gateway.acks()[-1] == 1, "the ack of frame 1")
            await asyncio.sleep(0.2)  # the other four arrived, but nobody took them
            assert max(gateway.acks()) == 1
            for _ in range(4):
                await anext(live)
            await eventually(lambda: gateway.acks()[-1] == 5, "the ack of frame 5")
        finally:
            await live.close()
            await server.stop(0)

    asyncio.run(scenario())


def test_speech_frames_dropped_after_a_clear_are_acknowledged_too() -> None:
    async def scenario() -> None:
        gateway = FramingGateway([True] * 5 + [False])
        server, live = await session_on(gateway)
        try:
            await anext(live)
            live.clear()
            gateway.go.put_nowait(6)
            # Dropped on arrival, before the consumer asks for anything: acknowledged at once.
            await eventually(lambda: gateway.acks() and gateway.acks()[-1] == 4, "the ack of frame 4")
            frame = await anext(live)
            assert (frame.index, frame.speech) == (5, False)  # the speech from before the Clear is gone
            await eventually(lambda: gateway.acks() and gateway.acks()[-1] == 5, "the ack of frame 5")
            assert [r.WhichOneof("request") for r in gateway.requests[:2]] == ["start", "clear"]
        finally:
            await live.close()
            await server.stop(0)

    asyncio.run(scenario())
