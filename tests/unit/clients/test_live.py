"""LiveSession's frame acknowledgements (issue 29): it asks for an ack window of about a second of
frames, acknowledges a frame when the consumer takes it (never when it only arrived), and
acknowledges the frames it drops after a Clear, so a window full of them cannot stall the stream.
A real grpc.aio server in this process stands in for the gateway."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import grpc

from lipline_client.live import LiveSession, slot_samples
from lipline_client.v1 import gateway_pb2_grpc, session_pb2
from services.live.audio_retime import frame_sample_range

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


async def session_on(gateway: gateway_pb2_grpc.GatewayServicer) -> tuple[grpc.aio.Server, LiveSession]:
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


class ScriptedGateway(gateway_pb2_grpc.GatewayServicer):
    """Converse: Ready, then `responses` in the order given, then the stream stays open."""

    def __init__(self, responses: list[session_pb2.ConverseResponse]) -> None:
        self.responses = responses

    async def Converse(self, request_iterator, context):  # type: ignore[no-untyped-def]
        yield session_pb2.ConverseResponse(ready=session_pb2.Ready(next_frame=0))
        for response in self.responses:
            yield response
        async for _ in request_iterator:
            pass


SLOT = 1280  # bytes of one frame's audio: 16 kHz (the session's default rate) at 25 fps


def frame(index: int, speech: bool, audio: bytes) -> session_pb2.ConverseResponse:
    return session_pb2.ConverseResponse(
        frame=session_pb2.VideoFrame(index=index, speech=speech, utterance=1 if speech else 0, audio=audio)
    )


def event(kind: int, at: int) -> session_pb2.ConverseResponse:
    return session_pb2.ConverseResponse(event=session_pb2.SessionEvent(kind=kind, utterance=1, frame=at))


def voice(n: int) -> bytes:
    """n slots of speech whose every sample is nonzero."""
    return bytes([7, 1]) * (n * SLOT // 2)


def taken_with_speech_audio(script: list[session_pb2.ConverseResponse]) -> list[tuple[str, int, int]]:
    """What a consumer takes from a session that sends `script`, in order: ("frame", index, bytes of
    `speech_audio`, asked as the frame is taken) or ("event", frame, kind)."""

    async def scenario() -> list[tuple[str, int, int]]:
        server, live = await session_on(ScriptedGateway(script))
        taken: list[tuple[str, int, int]] = []
        try:
            assert isinstance(await anext(live), session_pb2.Ready)
            while len(taken) < len(script):
                item = await anext(live)
                if isinstance(item, session_pb2.VideoFrame):
                    taken.append(("frame", item.index, len(live.speech_audio(item))))
                elif isinstance(item, session_pb2.SessionEvent):
                    taken.append(("event", item.frame, item.kind))
        finally:
            await live.close()
            await server.stop(0)
        return taken

    return asyncio.run(scenario())


STARTED, FINISHED = session_pb2.SessionEvent.PLAYBACK_STARTED, session_pb2.SessionEvent.PLAYBACK_FINISHED


def test_the_audio_of_speech_frames_skipped_at_the_end_is_counted_before_playback_finished() -> None:
    """An utterance of frames 1-4 whose frames 3 and 4 were skipped (faces late): the worker sends
    PLAYBACK_FINISHED (frame 5) with frame 4's tick, ahead of idle frame 5, which carries frames 3 and 4's
    audio before its own slot's silence. The consumer gets the event after frame 5, and
    `speech_audio` gives all four frames' audio, none of the idle silence."""
    script = [
        frame(0, False, bytes(SLOT)),
        event(STARTED, 1),
        frame(1, True, voice(1)),
        frame(2, True, bytes(SLOT)),  # digital silence inside the speech: still speech
        event(FINISHED, 5),
        frame(5, False, voice(1) + bytes(SLOT) + bytes(SLOT)),  # frame 3's voice, frame 4's silence, its own
        frame(6, False, bytes(SLOT)),
    ]
    assert taken_with_speech_audio(script) == [
        ("frame", 0, 0),
        ("event", 1, STARTED),
        ("frame", 1, SLOT),
        ("frame", 2, SLOT),
        ("frame", 5, 2 * SLOT),
        ("event", 5, FINISHED),
        ("frame", 6, 0),
    ]


def test_an_idle_frame_while_an_utterance_plays_adds_no_silence() -> None:
    """A pause for late audio mid-utterance is an idle frame with its own slot's silence: not speech."""
    script = [event(STARTED, 0), frame(0, True, voice(1)), frame(1, False, bytes(SLOT)), frame(2, True, voice(1))]
    assert [t for t in taken_with_speech_audio(script) if t[0] == "frame"] == [
        ("frame", 0, SLOT),
        ("frame", 1, 0),
        ("frame", 2, SLOT),
    ]


def test_slot_samples_follow_the_workers_cut() -> None:
    """The client's slot lengths are the live worker's (services/live/audio_retime.py), whole or not."""
    for rate, fps, worker_fps in ((16000, 25.0, Fraction(25)), (48000, 30000 / 1001, Fraction(30000, 1001))):
        for k in range(200):
            start, stop = frame_sample_range(k, rate, worker_fps)
            assert slot_samples(k, rate, fps) == stop - start, (rate, fps, k)
