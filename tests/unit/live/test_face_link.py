"""FaceLink against real gRPC servers on 127.0.0.1: the lipsync stage itself (procedural model, its own
process), and a small LipSyncService servicer in the test where a failure has to be injected.

The servicer answers like the stage (faces in request order, the crop resized to its paste size, or
96x96 with raw_size) and keeps every request of every stream, so the tests can count messages.

Every test holds on a loaded 2-core machine: faces get a generous deadline (`RELAXED`) wherever
lateness is not what the test is about, a test waits for what it needs to have happened rather than
sleeping and hoping, and time limits are only upper bounds for "eventually". How many faces come
back on time is a count that follows the CPU: bench/bench_live_link.py measures it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import cv2
import grpc
import numpy as np
import pytest

from lipline.v1 import lipsync_pb2, lipsync_pb2_grpc, superres_pb2, superres_pb2_grpc
from services.live import face_link
from services.live.face_link import FaceLate, FaceLink, FaceLinkSettings, ReferenceFace, avatar_reference_faces
from services.local.cluster import LOCAL_FLAGS
from services.local.process import ServiceProcess, start
from services.media.packed import PackedImages
from services.media.wire import image_from_proto, image_to_proto
from services.serving.channels import StageFailed, open_channel
from services.serving.errors import InvalidRequest

MEL = np.full((80, 16), -1.0, np.float32)
RELAXED = 10.0  # default_due_s where lateness is not under test: a loaded machine never makes a face late


async def eventually(check, timeout: float = 10.0, what: str = "") -> None:  # type: ignore[no-untyped-def]
    """Waits (on the event loop) until `check()` holds; fails after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def solid_crop(bgr: tuple[int, int, int], paste: tuple[int, int] = (120, 130)) -> ReferenceFace:
    """A 96x96 crop of one colour, pasted back at `paste` (width, height)."""
    return ReferenceFace(np.full((96, 96, 3), bgr, np.uint8), *paste)


def colour_of(index: int) -> tuple[int, int, int]:
    """A distinct colour per session (mid-range: no clipping in the model's round trip)."""
    return (40 + (index * 37) % 180, 40 + (index * 71) % 180, 40 + (index * 113) % 180)


class RecordingLipSync(lipsync_pb2_grpc.LipSyncServiceServicer):
    """Generate as the stage answers it (in order; the crop at its paste size, or 96x96 raw), keeping
    every stream's requests. `abort_next`: the next message with items ends its stream UNAVAILABLE;
    `delay_s`: each answer waits this long."""

    def __init__(self) -> None:
        self.streams: list[list[lipsync_pb2.GenerateRequest]] = []
        self.abort_next = False
        self.delay_s = 0.0
        self.half_closed = 0  # streams the client ended by closing its side (after every answer)
        self.answered = 0  # messages with items answered, every stream

    def item_messages(self) -> list[lipsync_pb2.GenerateRequest]:
        return [r for stream in self.streams for r in stream if r.items.frame_indices]

    async def Generate(
        self, request_iterator: AsyncIterator[lipsync_pb2.GenerateRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator:
        seen: list[lipsync_pb2.GenerateRequest] = []
        self.streams.append(seen)
        crops: dict[int, np.ndarray] = {}
        paste: dict[int, tuple[int, int]] = {}
        async for request in request_iterator:
            seen.append(request)
            for crop in request.crops:
                crops[crop.crop_index] = image_from_proto(crop.image)
                paste[crop.crop_index] = (crop.paste_width, crop.paste_height)
            if not request.items.frame_indices:
                continue
            if self.abort_next:
                self.abort_next = False
                await context.abort(grpc.StatusCode.UNAVAILABLE, "injected: the replica went away")
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            indices = list(request.items.crop_indices)
            if any(c not in crops for c in indices):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an item names a crop this stream has not sent")
            faces = [crops[c] if request.raw_size else cv2.resize(crops[c], paste[c]) for c in indices]
            self.answered += 1
            yield lipsync_pb2.GenerateResponse(
                faces=PackedImages.from_arrays(faces).to_pb(list(request.items.frame_indices), indices)
            )
        self.half_closed += 1


class ResizingSuperRes(superres_pb2_grpc.SuperResServiceServicer):
    """Upscale as the stage's Lanczos fallback does (resize to the asked size), keeping every request."""

    def __init__(self) -> None:
        self.requests: list[superres_pb2.UpscaleRequest] = []

    async def Upscale(
        self, request_iterator: AsyncIterator[superres_pb2.UpscaleRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator:
        async for request in request_iterator:
            self.requests.append(request)
            items = [
                superres_pb2.UpscaleItem(
                    index=i.index,
                    image=image_to_proto(cv2.resize(image_from_proto(i.image), (i.out_width, i.out_height))),
                )
                for i in request.items
            ]
            yield superres_pb2.UpscaleResponse(items=items)


@contextlib.asynccontextmanager
async def serving(*servicers: object) -> AsyncIterator[str]:
    """A real grpc.aio server on 127.0.0.1 (a free port) with the given servicers; its address."""
    server = grpc.aio.server()
    for servicer in servicers:
        if isinstance(servicer, lipsync_pb2_grpc.LipSyncServiceServicer):
            lipsync_pb2_grpc.add_LipSyncServiceServicer_to_server(servicer, server)
        else:
            superres_pb2_grpc.add_SuperResServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def linked(address: str, settings: FaceLinkSettings, superres: bool = False) -> AsyncIterator[FaceLink]:
    channel = open_channel(address, 64 * 2**20)
    link = FaceLink(
        lipsync_pb2_grpc.LipSyncServiceStub(channel),
        superres_pb2_grpc.SuperResServiceStub(channel) if superres else None,
        settings,
    )
    try:
        async with link:
            yield link
    finally:
        await channel.close()


def assert_face(face: np.ndarray, bgr: tuple[int, int, int], size: tuple[int, int] = (120, 130)) -> None:
    assert face.shape == (size[1], size[0], 3)
    assert np.abs(face.astype(int) - np.array(bgr)).max() <= 1, f"face is not the session's colour {bgr}"


def test_many_sessions_share_one_message_per_tick() -> None:
    async def main() -> None:
        servicer = RecordingLipSync()
        settings = FaceLinkSettings(flush_interval_s=0.04, default_due_s=RELAXED)
        async with serving(servicer) as address, linked(address, settings) as link:
            sessions = 20
            for s in range(sessions):
                link.register(("session", s), [solid_crop(colour_of(s))])
            for frame in range(3):
                futures = [link.submit(("session", s), frame, 0, MEL) for s in range(sessions)]
                faces = await asyncio.gather(*futures)
                for s, face in enumerate(faces):
                    assert_face(face, colour_of(s))
            messages = servicer.item_messages()
            assert [len(m.items.frame_indices) for m in messages] == [sessions] * 3, (
                "one message per tick carries every session's frame"
            )
            assert len(servicer.streams) == 1
            assert sum(len(r.crops) for r in servicer.streams[0]) == sessions, "each session's crops are sent once"
            assert link.counters.generate_messages == 3 and link.counters.generate_items == 3 * sessions
            assert link.counters.faces == 3 * sessions

    asyncio.run(main())


def test_a_full_message_goes_at_once_without_waiting_for_the_tick() -> None:
    async def main() -> None:
        servicer = RecordingLipSync()
        settings = FaceLinkSettings(flush_interval_s=30.0, max_items_per_message=8, default_due_s=60.0)
        async with serving(servicer) as address, linked(address, settings) as link:
            link.register("a", [solid_crop((10, 200, 30))])
            # Queued before the stream opens, so the stream's first tick (at once) sends it; once its
            # face is back, that tick has passed and the next is 30 s away.
            await link.submit("a", 100, 0, MEL)
            futures = [link.submit("a", i, 0, MEL) for i in range(20)]
            await asyncio.wait_for(asyncio.gather(*futures[:16]), timeout=30.0)  # two full messages of 8 went at once
            await asyncio.sleep(0.1)
            assert not any(f.done() for f in futures[16:]), "the last 4 wait for the tick"
            assert [len(m.items.frame_indices) for m in servicer.item_messages()] == [1, 8, 8]
            for future in futures[16:]:
                future.cancel()

    asyncio.run(main())


def test_a_stream_killed_midway_fails_its_items_and_the_link_recovers() -> None:
    async def main() -> None:
        servicer = RecordingLipSync()
        settings = FaceLinkSettings(flush_interval_s=0.02, default_due_s=RELAXED)
        async with serving(servicer) as address, linked(address, settings) as link:
            link.register("a", [solid_crop((200, 10, 10)), solid_crop((10, 10, 200), (80, 90))])
            link.register("b", [solid_crop((10, 200, 10))])
            assert_face(await link.submit("a", 0, 1, MEL), (10, 10, 200), (80, 90))

            servicer.abort_next = True
            doomed = [link.submit("a", 1, 0, MEL), link.submit("b", 1, 0, MEL)]
            for outcome in await asyncio.gather(*doomed, return_exceptions=True):
                assert (
                    isinstance(outcome, StageFailed)
                    and outcome.retryable
                    and outcome.code == grpc.StatusCode.UNAVAILABLE
                ), outcome
                assert "lipsync" in str(outcome)

            # The link opened a new stream on its own and sent every registered session's crops there first.
            faces = await asyncio.gather(
                link.submit("a", 2, 0, MEL), link.submit("b", 2, 0, MEL), link.submit("a", 3, 1, MEL)
            )
            assert_face(faces[0], (200, 10, 10))
            assert_face(faces[1], (10, 200, 10))
            assert_face(faces[2], (10, 10, 200), (80, 90))
            assert len(servicer.streams) == 2
            first = next(r for r in servicer.streams[1] if r.crops or r.items.frame_indices)
            assert len(first.crops) == 3, (
                "the new stream's first message re-sends the crops of every registered session"
            )
            assert link.counters.failed == 2 and link.counters.stream_errors == 1 and link.counters.streams_opened == 2

    asyncio.run(main())


def test_a_message_that_fails_to_be_built_fails_its_items_with_a_status_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The link writes its requests itself (no request iterator is handed to gRPC): a failure while it
    builds a message (here: its `on_message` callback) fails that message's items at once with a
    StageFailed INTERNAL naming it, is logged, and the link opens the stream again (issue 29)."""
    built: list[int] = []

    def on_message(stage: str, items: int) -> None:
        built.append(items)
        if len(built) == 1:
            raise RuntimeError("the items histogram broke")

    async def main() -> None:
        servicer = RecordingLipSync()
        settings = FaceLinkSettings(flush_interval_s=0.02, default_due_s=30.0)
        async with serving(servicer) as address:
            channel = open_channel(address, 64 * 2**20)
            link = FaceLink(lipsync_pb2_grpc.LipSyncServiceStub(channel), None, settings, on_message=on_message)
            try:
                async with link:
                    link.register("a", [solid_crop((200, 10, 10))])
                    with caplog.at_level(logging.ERROR, logger=face_link.__name__):
                        with pytest.raises(StageFailed, match="the items histogram broke") as failed:
                            await asyncio.wait_for(link.submit("a", 0, 0, MEL), 10)
                    assert failed.value.code == grpc.StatusCode.INTERNAL
                    # (only this link's failure: records of other links still winding down are not this test's)
                    ours = [
                        r for r in caplog.records if r.exc_info and "the items histogram broke" in str(r.exc_info[1])
                    ]
                    assert [r.getMessage() for r in ours] == ["face link stream failed unexpectedly"]
                    assert_face(await asyncio.wait_for(link.submit("a", 1, 0, MEL), 10), (200, 10, 10))
                    assert link.counters.failed == 1 and link.counters.late == 0
            finally:
                await channel.close()

    asyncio.run(main())


async def speak(link: FaceLink, sessions: list, seconds: float, fps: float = 25.0) -> list[np.ndarray]:
    """Every session submits a frame every 1/fps for `seconds`, like live sessions; all the faces, in order."""
    futures = []
    for frame in range(int(seconds * fps)):
        futures += [link.submit(s, frame, 0, MEL, speech=0.0) for s in sessions]
        await asyncio.sleep(1 / fps)
    return await asyncio.gather(*futures)


def test_old_streams_are_replaced_before_break_and_lose_nothing() -> None:
    async def main() -> None:
        servicer = RecordingLipSync()
        servicer.delay_s = 0.03  # items are in flight at every handover
        settings = FaceLinkSettings(flush_interval_s=0.02, max_stream_age_s=0.25, default_due_s=RELAXED)
        async with serving(servicer) as address, linked(address, settings) as link:
            for s in range(3):
                link.register(s, [solid_crop(colour_of(s))])
            faces = await speak(link, [0, 1, 2], seconds=1.2)
            for i, face in enumerate(faces):
                assert_face(face, colour_of(i % 3))
            assert link.counters.streams_opened >= 4, link.counters
            assert link.counters.failed == 0 and link.counters.late == 0 and link.counters.stream_errors == 0, (
                link.counters
            )
            # A stream opened as the talking ended may have carried nothing before the link closed.
            used = [stream for stream in servicer.streams if any(r.crops or r.items.frame_indices for r in stream)]
            assert len(used) >= 4, [len(stream) for stream in servicer.streams]
            for stream in used:
                first = next(r for r in stream if r.crops or r.items.frame_indices)
                assert len(first.crops) == 3 and not first.items.frame_indices, (
                    "a new stream sends every crop before any item"
                )
            # The stage sees a replaced stream's half-close a moment after the link got its last answer.
            await eventually(
                lambda: servicer.half_closed >= len(servicer.streams) - 1,
                what="each replaced stream closed by the link, not cut",
            )

    asyncio.run(main())


def test_an_unregistered_sessions_faces_are_dropped_and_its_crops_reused() -> None:
    async def main() -> None:
        servicer = RecordingLipSync()
        servicer.delay_s = 0.3
        async with (
            serving(servicer) as address,
            linked(address, FaceLinkSettings(flush_interval_s=0.02, default_due_s=RELAXED)) as link,
        ):
            link.register("a", [solid_crop((200, 0, 200))])
            link.register("b", [solid_crop((0, 200, 200))])
            gone = link.submit("a", 0, 0, MEL)
            kept = link.submit("b", 0, 0, MEL)
            await eventually(lambda: servicer.item_messages(), what="both items in flight at the stage")
            link.unregister("a")
            assert gone.cancelled()
            # "c" takes the crop index "a" had; "a"'s face, still in flight, must not reach it.
            link.register("c", [solid_crop((250, 250, 0))])
            assert link.crops_in_use == 2
            late = link.submit("c", 0, 0, MEL)
            assert_face(await kept, (0, 200, 200))
            assert_face(await late, (250, 250, 0))
            assert link.counters.dropped == 1 and link.counters.faces == 2
            with pytest.raises(InvalidRequest):
                link.submit("a", 1, 0, MEL)

    asyncio.run(main())


def test_a_face_past_its_deadline_fails_with_face_late() -> None:
    async def main() -> None:
        servicer = RecordingLipSync()
        settings = FaceLinkSettings(fps=25, late_frames=2, flush_interval_s=0.01, default_due_s=RELAXED)
        async with serving(servicer) as address, linked(address, settings) as link:
            link.register("a", [solid_crop((1, 2, 3))])
            assert_face(await link.submit("a", 0, 0, MEL), (1, 2, 3))  # the stream is up
            servicer.delay_s = 3.0  # far past the deadline: the future must fail at it, not when the face comes
            loop = asyncio.get_running_loop()
            started = loop.time()
            future = link.submit("a", 1, 0, MEL, due=started + 0.3)
            with pytest.raises(FaceLate):
                await future
            waited = loop.time() - started
            assert 0.37 <= waited < 2.5, f"failed {waited:.3f} s after submission; due + 2 frames is 0.38 s"
            assert link.counters.late == 1
            servicer.delay_s = 0.0
            await eventually(lambda: link.counters.dropped == 1, what="the late face to come back and be dropped")
            assert_face(await link.submit("a", 2, 0, MEL), (1, 2, 3))

    asyncio.run(main())


def test_super_resolution_chains_upscale_after_raw_faces() -> None:
    async def main() -> None:
        lipsync, superres = RecordingLipSync(), ResizingSuperRes()
        async with (
            serving(lipsync, superres) as address,
            linked(address, FaceLinkSettings(flush_interval_s=0.02, default_due_s=RELAXED), superres=True) as link,
        ):
            link.register("plain", [solid_crop((30, 60, 90))])
            link.register("sharp", [solid_crop((90, 60, 30), (200, 210))], super_resolution=True)
            plain, sharp = await asyncio.gather(link.submit("plain", 0, 0, MEL), link.submit("sharp", 0, 0, MEL))
            assert_face(plain, (30, 60, 90))
            assert_face(sharp, (90, 60, 30), (200, 210))
            raw = [m for m in lipsync.item_messages() if m.raw_size]
            assert len(raw) == 1 and list(raw[0].items.frame_indices) == [0], (
                "the super-resolution session's item asks for a 96x96 face"
            )
            assert len(superres.requests) == 1 and superres.requests[0].items[0].out_width == 200
            assert link.counters.upscale_messages == 1 and link.counters.upscale_items == 1

    asyncio.run(main())


def test_settings_refuse_values_that_cannot_work() -> None:
    for bad in (
        {"fps": 0},
        {"flush_interval_s": 0},
        {"max_items_per_message": 0},
        {"max_stream_age_s": 0},
        {"backoff_initial_s": 5.0},
    ):
        with pytest.raises(ValueError):
            FaceLinkSettings(**bad)
    assert FaceLinkSettings().interval_s == 0.04 and FaceLinkSettings().late_s == 0.08


def test_register_rejects_bad_crops_and_full_streams() -> None:
    async def main() -> None:
        servicer = RecordingLipSync()
        async with serving(servicer) as address, linked(address, FaceLinkSettings(max_crops=3)) as link:
            with pytest.raises(InvalidRequest, match="96, 96, 3"):
                link.register("a", [ReferenceFace(np.zeros((64, 64, 3), np.uint8), 64, 64)])
            with pytest.raises(InvalidRequest, match="superres"):
                link.register("a", [solid_crop((0, 0, 0))], super_resolution=True)
            link.register("a", [solid_crop((0, 0, 0))] * 2)
            with pytest.raises(Exception, match="crop indices left"):
                link.register("b", [solid_crop((0, 0, 0))] * 2)
            link.unregister("a")
            link.register("b", [solid_crop((0, 0, 0))] * 3)
            assert link.crops_in_use == 3

    asyncio.run(main())


def test_sessions_of_one_avatar_share_its_crops() -> None:
    async def main() -> None:
        servicer = RecordingLipSync()
        settings = FaceLinkSettings(flush_interval_s=0.02, default_due_s=RELAXED)
        async with serving(servicer) as address, linked(address, settings) as link:
            avatar = [solid_crop((70, 80, 90)), solid_crop((90, 80, 70), (60, 70))]
            for s in range(5):
                link.register(s, avatar, shared_as="avatar-1")
            link.register("other", [solid_crop((5, 5, 5))])
            assert link.crops_in_use == 3
            faces = await asyncio.gather(*(link.submit(s, 0, s % 2, MEL) for s in range(5)))
            for s, face in enumerate(faces):
                if s % 2 == 0:
                    assert_face(face, (70, 80, 90))
                else:
                    assert_face(face, (90, 80, 70), (60, 70))
            assert sum(len(r.crops) for r in servicer.streams[0]) == 3, (
                "the shared avatar's 2 crops went once, not 5 times"
            )
            for s in range(4):
                link.unregister(s)
            assert link.crops_in_use == 3, "a session still uses the avatar's crops"
            assert_face(await link.submit(4, 1, 1, MEL), (90, 80, 70), (60, 70))
            link.unregister(4)
            assert link.crops_in_use == 1
            link.register("x", avatar, shared_as="avatar-2")
            with pytest.raises(InvalidRequest, match="registered with 2"):
                link.register("y", avatar[:1], shared_as="avatar-2")

    asyncio.run(main())


def test_messages_stay_within_what_the_stage_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message's faces never add up to more than the stage returns for one (its own bound, here
    lowered to 3 faces' worth), and a bad mel window is refused at submit, before it could fail a
    message that carries every session's items."""
    from services.inference.request_bounds import MAX_OUTPUT_BYTES_PER_MESSAGE

    assert face_link.MAX_RETURNED_BYTES_PER_MESSAGE == MAX_OUTPUT_BYTES_PER_MESSAGE
    monkeypatch.setattr(face_link, "MAX_RETURNED_BYTES_PER_MESSAGE", 3 * 120 * 130 * 3)

    async def main() -> None:
        servicer = RecordingLipSync()
        settings = FaceLinkSettings(flush_interval_s=0.02, default_due_s=RELAXED)
        async with serving(servicer) as address, linked(address, settings) as link:
            link.register("a", [solid_crop((1, 1, 1))])
            bad = MEL.copy()
            bad[3, 4] = np.nan
            with pytest.raises(InvalidRequest, match="NaN"):
                link.submit("a", 0, 0, bad)
            with pytest.raises(InvalidRequest, match="NaN"):
                link.submit("a", 0, 0, MEL * 1e6)  # beyond float16
            await asyncio.gather(*(link.submit("a", i, 0, MEL) for i in range(7)))
            assert [len(m.items.frame_indices) for m in servicer.item_messages()] == [3, 3, 1]

    asyncio.run(main())


def test_an_avatars_crops_register_by_template_frame() -> None:
    """avatar_reference_faces: a LocalAvatar's boxes and crop rows -> the crops and the template
    frame -> crop index map; the face of a template frame comes back at that frame's box size."""
    boxes = [(10, 20, 110, 140), (12, 20, 112, 141), None, (14, 22, 100, 130)]
    crops = np.stack([np.full((96, 96, 3), 60 * (r + 1), np.uint8) for r in range(3)])
    crop_row = {0: 2, 1: 0, 3: 1}  # rows in meta.crop_frames order, not frame order
    faces, index = avatar_reference_faces(boxes, crops, crop_row)
    assert index == {0: 0, 1: 1, 3: 2} and [(f.paste_width, f.paste_height) for f in faces] == [
        (100, 120),
        (100, 121),
        (86, 108),
    ]

    async def main() -> None:
        async with (
            serving(RecordingLipSync()) as address,
            linked(address, FaceLinkSettings(flush_interval_s=0.02, default_due_s=RELAXED)) as link,
        ):
            link.register("s", faces, shared_as="avatar-7")
            face = await link.submit("s", 0, index[3], MEL)
            assert_face(face, (120, 120, 120), (86, 108))  # template frame 3: crop row 1, its box's size

    asyncio.run(main())


# --- the real lipsync stage, its own process (procedural model, CPU) ---------------------------------


@pytest.fixture(scope="module")
def lipsync_stage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    workdir = tmp_path_factory.mktemp("lipsync")
    process = start("lipsync", "lipsync", ["--device=cpu", "--detector=none"], workdir, base_args=LOCAL_FLAGS)
    try:
        process.wait_ready(120)
        yield process
    finally:
        process.kill()


def restart_on_same_port(old: ServiceProcess, workdir: Path) -> ServiceProcess:
    new = start("lipsync", "lipsync", [*old.args, f"--port={old.port}"], workdir, base_args=LOCAL_FLAGS)
    new.wait_ready(120)
    return new


def test_the_real_stage_routes_every_sessions_face(lipsync_stage: ServiceProcess) -> None:
    async def main() -> None:
        async with linked(
            lipsync_stage.address, FaceLinkSettings(flush_interval_s=0.04, default_due_s=RELAXED)
        ) as link:
            sessions = 12
            for s in range(sessions):
                # Two crops each, different paste sizes: the face comes back at its own crop's size.
                link.register(
                    s, [solid_crop(colour_of(s), (100 + s, 110)), solid_crop(colour_of(s + 50), (90, 95 + s))]
                )
            for frame in range(2):
                futures = [link.submit(s, frame, frame % 2, MEL, speech=0.0) for s in range(sessions)]
                for s, face in enumerate(await asyncio.gather(*futures)):
                    # Silence (speech 0) leaves the procedural model's face untouched: the crop itself.
                    if frame % 2 == 0:
                        assert_face(face, colour_of(s), (100 + s, 110))
                    else:
                        assert_face(face, colour_of(s + 50), (90, 95 + s))
            assert link.counters.generate_messages == 2, "each tick's 12 frames went as one message"
            # Speech opens the mouth: a dark inner mouth in the lower middle of this session's face only.
            loud, quiet = await asyncio.gather(
                link.submit(3, 2, 0, MEL, speech=1.0), link.submit(4, 2, 0, MEL, speech=0.0)
            )
            mouth = loud[70:90, 40:60].astype(int).sum(axis=2).mean()
            assert mouth < sum(colour_of(3)) - 60, "speech 1.0 opened the mouth"
            assert_face(quiet, colour_of(4), (104, 110))
            assert link.models["lipsync"]["name"] == "procedural"

    asyncio.run(main())


def test_the_real_stage_cutting_old_connections_costs_no_face(tmp_path: Path) -> None:
    """The stage closes every connection after 1 s (GOAWAY, then a 2 s grace, then it cuts what is
    still open): the link replaces its stream every 0.8 s, so no call is ever cut. (With
    max_stream_age_s=None the same run counts a stream error at ~3 s.)"""
    flags = ["--device=cpu", "--detector=none", "--max-connection-age-s=1", "--max-connection-age-grace-s=2"]
    process = start("lipsync", "lipsync", flags, tmp_path, base_args=LOCAL_FLAGS)

    async def main() -> None:
        async with linked(process.address, FaceLinkSettings(max_stream_age_s=0.8, default_due_s=RELAXED)) as link:
            for s in range(4):
                link.register(s, [solid_crop(colour_of(s))])
            faces = await speak(link, [0, 1, 2, 3], seconds=4.5)
            for i, face in enumerate(faces):
                assert_face(face, colour_of(i % 4))
            assert (
                link.counters.streams_opened >= 3 and link.counters.stream_errors == 0 and link.counters.failed == 0
            ), link.counters

    try:
        process.wait_ready(120)
        asyncio.run(main())
    finally:
        process.kill()


def test_the_real_stage_killed_and_restarted(lipsync_stage: ServiceProcess, tmp_path: Path) -> None:
    async def main() -> None:
        nonlocal lipsync_stage
        settings = FaceLinkSettings(flush_interval_s=0.04, default_due_s=3.0, backoff_max_s=0.5)
        async with linked(lipsync_stage.address, settings) as link:
            link.register("a", [solid_crop((20, 120, 220))])
            assert_face(await link.submit("a", 0, 0, MEL, speech=0.0), (20, 120, 220))
            sent = link.counters.crops_sent
            lipsync_stage.kill()  # SIGKILL: no drain, the stream just breaks
            failed = await asyncio.gather(
                *(link.submit("a", i, 0, MEL, speech=0.0) for i in range(1, 4)), return_exceptions=True
            )
            assert all(isinstance(f, (StageFailed, FaceLate)) for f in failed), failed
            lipsync_stage = await asyncio.to_thread(restart_on_same_port, lipsync_stage, tmp_path)
            for frame in range(4, 100):
                try:
                    face = await link.submit("a", frame, 0, MEL, speech=0.0)
                    break
                except (StageFailed, FaceLate):
                    await asyncio.sleep(0.1)
            else:
                pytest.fail("the link did not recover after the stage came back")
            assert_face(face, (20, 120, 220))
            assert link.counters.crops_sent > sent, "the new stream re-sent the session's crops"
            assert link.counters.streams_opened >= 2

    try:
        asyncio.run(main())
    finally:
        lipsync_stage.kill()


def test_an_overloaded_stage_gets_only_faces_it_can_answer_in_time() -> None:
    """A stage that answers one message every 0.1 s (10 a second), asked for one a frame (25 a
    second). Without shedding its queue grows without bound (~45 messages after 3 s) and, after the
    first few, every face comes back late. The link sends an item only while the stage's round trip
    leaves it time before its deadline (due + 80 ms) and sheds the rest unsent.

    Asserted is what holds however slowly a loaded machine runs this process: an item is written
    only while the oldest message the stage has not answered is younger than the item's deadline
    lead (at most 180 ms), so the messages waiting at the stage are those of the last 180 ms of
    ticks (at most 7 at one every 40 ms; a slower loop sends fewer), never a growing queue; and faces
    still come back on time after the queue would have grown (at least one: how many follows the
    CPU, and is bench/bench_live_link.py's to measure)."""

    async def main() -> None:
        servicer = RecordingLipSync()
        servicer.delay_s = 0.1  # each message answered 0.1 s after the previous one: 10 a second
        fps = 25.0
        settings = FaceLinkSettings(fps=fps, late_frames=2.0)  # deadline: due + 80 ms
        async with serving(servicer) as address, linked(address, settings) as link:
            sessions = [0, 1, 2, 3]
            for s in sessions:
                link.register(s, [solid_crop(colour_of(s))])
            loop = asyncio.get_running_loop()
            futures: list[tuple[float, asyncio.Future]] = []
            waiting = []  # messages written and not yet answered by the stage, after each frame
            for frame in range(int(3.0 * fps)):
                due = loop.time() + 0.1
                futures += [(loop.time(), link.submit(s, frame, 0, MEL, due=due)) for s in sessions]
                await asyncio.sleep(1 / fps)
                waiting.append(link.counters.generate_messages - servicer.answered)
            results = await asyncio.gather(*(f for _, f in futures), return_exceptions=True)
            on_time = [t for (t, _), r in zip(futures, results) if isinstance(r, np.ndarray)]
            late = [r for r in results if isinstance(r, FaceLate)]
            assert len(on_time) + len(late) == len(results), [
                r for r in results if not isinstance(r, (np.ndarray, FaceLate))
            ]
            assert link.counters.shed > 0 and link.counters.failed == 0, link.counters
            assert max(waiting) <= 8, f"messages waiting at the stage grew: {waiting}"
            # Faces keep coming after the first 1.5 s (a queue growing at the stage gives none then).
            start = futures[0][0]
            assert any(t - start > 1.5 for t in on_time), (len(on_time), link.counters)

    asyncio.run(main())
