"""CreateAvatar's work without its protos (services.gateway.avatars.add_avatar), on a temporary SQLite
job store and folder blob store, with a small real gRPC server on 127.0.0.1 standing in for the
lipsync stage's DetectFaces (a box, or no face, for every frame it is sent)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import cv2
import grpc
import numpy as np
import pytest

from lipline.v1 import common_pb2, lipsync_pb2, lipsync_pb2_grpc
from services.gateway.avatars import DETECT_ATTEMPTS, AvatarUpload, add_avatar
from services.gateway.settings import GatewaySettings
from services.jobs.avatars import content_hash, prefix
from services.jobs.store.jobs import AvatarRecord
from services.serving.channels import StageFailed
from services.serving.errors import InvalidMedia, InvalidRequest, NotReady, StoreUnavailable, TooLarge
from tests.helpers.stores import Stores, temp_stores
from tests.helpers.video_files import encode_video

SETTINGS = GatewaySettings()


def photo(seed: int = 0) -> bytes:
    image = np.random.default_rng(seed).integers(0, 256, (80, 72, 3), dtype=np.uint8)
    ok, png = cv2.imencode(".png", image)
    assert ok
    return png.tobytes()


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    with temp_stores(tmp_path) as s:
        yield s


class FaceFinder(lipsync_pb2_grpc.LipSyncServiceServicer):
    """DetectFaces as the stage answers a client that resends: a face in the middle of every frame
    (or none), after `arrivals` calls have arrived (so concurrent uploads really overlap)."""

    def __init__(
        self,
        found: bool = True,
        arrivals: int = 1,
        abort: grpc.StatusCode | None = None,
        aborts: int = 1000,
        on_call: Callable[[], None] | None = None,
    ) -> None:
        self.found = found
        self.on_call = on_call  # run as each call arrives (e.g. take the job store away)
        self.abort = abort  # end the first `aborts` calls with this status instead
        self.aborts = aborts
        self.calls = 0
        self._arrived = asyncio.Event()
        self._arrivals = arrivals

    async def DetectFaces(self, request_iterator, context):
        self.calls += 1
        if self.on_call is not None:
            self.on_call()
        if self.calls >= self._arrivals:
            self._arrived.set()
        await self._arrived.wait()
        faces = []
        async for request in request_iterator:  # every frame read, as the stage does, before it answers
            for frame in request.frames:
                box = common_pb2.Box(x1=8, y1=8, x2=60, y2=70) if self.found else None
                faces.append(lipsync_pb2.FaceDetection(index=frame.index, found=self.found, box=box))
            if request.end_of_frames:
                break
        if self.abort is not None and self.calls <= self.aborts:
            await context.abort(self.abort, "the stand-in stage says no")
        yield lipsync_pb2.DetectFacesResponse(faces=faces)


@contextlib.asynccontextmanager
async def lipsync_stage(finder: FaceFinder) -> AsyncIterator[lipsync_pb2_grpc.LipSyncServiceStub]:
    """`finder` served on an ephemeral port of 127.0.0.1."""
    server = grpc.aio.server()
    lipsync_pb2_grpc.add_LipSyncServiceServicer_to_server(finder, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield lipsync_pb2_grpc.LipSyncServiceStub(channel)
    finally:
        await server.stop(0)


def create(stores: Stores, finder: FaceFinder, *uploads: tuple[AvatarUpload, str]) -> list[AvatarRecord]:
    """add_avatar for every (upload, tenant), concurrently."""

    async def run() -> list[AvatarRecord]:
        async with lipsync_stage(finder) as stub:
            return list(
                await asyncio.gather(
                    *(add_avatar(stores.jobs, stores.blobs, stub, SETTINGS, u, t, "req-1") for u, t in uploads)
                )
            )

    return asyncio.run(run())


def test_an_avatar_is_prepared_stored_and_recorded_for_its_tenant(stores: Stores) -> None:
    finder = FaceFinder()
    upload = AvatarUpload(photo(), "ann", 25.0)
    (record,) = create(stores, finder, (upload, "acme"))
    assert (record.name, record.tenant, record.frame_count, record.faces_found) == ("ann", "acme", 1, 1)
    assert (record.width, record.height, record.fps) == (72, 80, 25.0)
    assert record.content_hash == content_hash(upload.data, 25.0)
    assert stores.jobs.get_avatar(record.id, "acme") == record
    keys = stores.blob_keys()
    assert keys and all(k.startswith(prefix(record.id)) for k in keys)
    assert finder.calls == 1


def test_the_same_upload_finds_the_tenants_avatar_and_another_tenant_gets_its_own(stores: Stores) -> None:
    finder = FaceFinder()
    upload = AvatarUpload(photo(), "ann", 25.0)
    (first,) = create(stores, finder, (upload, "acme"))
    (again,) = create(stores, finder, (upload, "acme"))
    assert again == first and finder.calls == 1  # no second DetectFaces
    (other,) = create(stores, finder, (upload, "globex"))
    assert other.id != first.id and other.tenant == "globex" and finder.calls == 2


def test_two_concurrent_same_uploads_keep_one_avatar_and_one_set_of_blobs(stores: Stores) -> None:
    finder = FaceFinder(arrivals=2)  # both pass the content index before either is recorded
    upload = AvatarUpload(photo(), "ann", 25.0)
    one, two = create(stores, finder, (upload, "acme"), (upload, "acme"))
    assert one == two and finder.calls == 2
    assert {k.split("/")[1] for k in stores.blob_keys()} == {one.id}  # the loser's blobs are gone
    assert stores.jobs.list_avatars(tenant="acme") == [one]


RID = "5b0c3d52-8a3e-4b1f-9a37-0c6f2b7d9e11"


def test_a_request_id_returns_its_avatar_and_refuses_another_request(stores: Stores) -> None:
    finder = FaceFinder()
    upload = AvatarUpload(photo(), "ann", 25.0, RID, {"user": "u1"})
    (first,) = create(stores, finder, (upload, "acme"))
    assert first.labels == {"user": "u1"}
    (again,) = create(stores, finder, (upload, "acme"))
    assert again == first and finder.calls == 1
    for other in (AvatarUpload(photo(1), "ann", 25.0, RID, {"user": "u1"}), AvatarUpload(photo(), "bo", 25.0, RID)):
        with pytest.raises(InvalidRequest, match=f"request_id {RID} was already used for a different avatar request"):
            create(stores, finder, (other, "acme"))
    # Known bytes under a new request id: the known avatar, and the id now names it.
    rid2 = "00000000-0000-4000-8000-000000000002"
    (known,) = create(stores, finder, (AvatarUpload(photo(), "ann", 25.0, rid2), "acme"))
    assert known.id == first.id and finder.calls == 1
    (globex,) = create(stores, finder, (upload, "globex"))  # the id is acme's only
    assert globex.id != first.id


def test_concurrent_uploads_with_one_request_id_keep_one_avatar(stores: Stores) -> None:
    finder = FaceFinder(arrivals=2)  # both pass the lookups before either is recorded
    one, two = create(stores, finder, *[(AvatarUpload(photo(), "ann", 25.0, RID), "acme")] * 2)
    assert one == two and finder.calls == 2
    assert {k.split("/")[1] for k in stores.blob_keys()} == {one.id}


def test_no_face_is_invalid_media_and_leaves_nothing(stores: Stores) -> None:
    with pytest.raises(InvalidMedia, match="no face found"):
        create(stores, FaceFinder(found=False), (AvatarUpload(photo(), "ann", 25.0), "acme"))
    assert stores.blob_keys() == []
    assert stores.jobs.list_avatars(tenant="acme") == []


def test_a_stage_call_ending_unavailable_is_tried_again(stores: Stores) -> None:
    finder = FaceFinder(abort=grpc.StatusCode.UNAVAILABLE, aborts=1)  # a replica draining, once
    (record,) = create(stores, finder, (AvatarUpload(photo(), "ann", 25.0), "acme"))
    assert finder.calls == 2 and record.faces_found == 1


def test_an_unavailable_lipsync_stage_is_tried_again_then_not_ready_and_leaves_nothing(stores: Stores) -> None:
    finder = FaceFinder(abort=grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(NotReady, match="lipsync"):
        create(stores, finder, (AvatarUpload(photo(), "ann", 25.0), "acme"))
    assert finder.calls == DETECT_ATTEMPTS
    assert stores.blob_keys() == []
    assert stores.jobs.list_avatars(tenant="acme") == []


def test_a_stage_refusing_the_avatar_keeps_its_status(stores: Stores) -> None:
    finder = FaceFinder(abort=grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(StageFailed) as err:
        create(stores, finder, (AvatarUpload(photo(), "ann", 25.0), "acme"))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and finder.calls == 1
    assert stores.blob_keys() == []


def test_an_upload_that_is_not_an_image_is_invalid_media_before_any_stage_call(stores: Stores) -> None:
    finder = FaceFinder()
    with pytest.raises(InvalidMedia):
        create(stores, finder, (AvatarUpload(b"not an image at all", "ann", 25.0), "acme"))
    assert finder.calls == 0 and stores.blob_keys() == []


def test_a_job_store_lost_during_the_upload_keeps_nothing_of_it(stores: Stores) -> None:
    """The avatar's blobs are written before it is recorded: a record that fails deletes them."""
    finder = FaceFinder(on_call=stores.jobs.close)
    # closed under a thread's open connection: sqlite3's own error; on a fresh thread: StoreUnavailable
    with pytest.raises((StoreUnavailable, sqlite3.ProgrammingError)):
        create(stores, finder, (AvatarUpload(photo(), "ann", 25.0), "acme"))
    assert finder.calls == 1 and stores.blob_keys() == []


@pytest.fixture(scope="module")
def too_long_video() -> bytes:
    """A 128x128 video one frame over the limit: refused only once its frames are decoded (issue 29)."""
    return encode_video("mp4", (128, 128), SETTINGS.max_avatar_frames + 1)


@pytest.fixture(scope="module")
def growing_video() -> bytes:
    """An MPEG-TS of 200 frames at 64x64, then 20 at 2400x1600, past the pixel limit (issue 29)."""
    return encode_video("mpegts", (64, 64), 200) + encode_video("mpegts", (2400, 1600), 20)


def test_a_video_over_the_frame_limit_found_while_decoding_is_too_large_and_leaves_nothing(
    stores: Stores, too_long_video: bytes
) -> None:
    # The limit is met in DetectFaces' request stream: it must come out here as itself.
    with pytest.raises(TooLarge, match=f"more than {SETTINGS.max_avatar_frames} frames"):
        create(stores, FaceFinder(), (AvatarUpload(too_long_video, "long", 0.0), "acme"))
    assert stores.blob_keys() == [] and stores.jobs.list_avatars(tenant="acme") == []


def test_a_video_growing_past_the_pixel_limit_while_decoding_is_invalid_and_leaves_nothing(
    stores: Stores, growing_video: bytes
) -> None:
    with pytest.raises(InvalidMedia, match=f"limited to {SETTINGS.max_avatar_pixels} pixels"):
        create(stores, FaceFinder(), (AvatarUpload(growing_video, "growing", 0.0), "acme"))
    assert stores.blob_keys() == [] and stores.jobs.list_avatars(tenant="acme") == []
