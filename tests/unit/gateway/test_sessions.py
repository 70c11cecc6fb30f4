"""Live sessions through the gateway's functions (services.gateway.sessions, .live_workers, .converse),
on a temporary SQLite job store, with small real grpc.aio LiveService servers on 127.0.0.1 standing
in for live workers (the real one is services.live; its own tests cover it): they lease sessions in
the store, refuse when full or draining, and answer a Converse stream with a frame per audio chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from lipline.v1 import live_pb2, live_pb2_grpc, session_pb2
from services.gateway.converse import converse
from services.gateway.live_workers import LiveWorkerError, LiveWorkers
from services.gateway.sessions import (
    SessionRequest,
    check_last_frame,
    close_session,
    create_session,
    output_size,
    resolve_session,
    session_to_proto,
    token_matches,
    token_sha256,
)
from services.gateway.settings import GatewaySettings
from services.jobs.store import open_job_store
from services.jobs.store.jobs import AvatarRecord, JobStore
from services.jobs.store.sessions import SessionState
from services.serving.channels import SERVICE_CONFIG
from services.serving.errors import FailedPrecondition, InvalidRequest, NoCapacity, NotFound, PermissionDenied

T = TypeVar("T")
AVATAR = "0123456789abcdef01234567"
TENANT = "acme"
SETTINGS = GatewaySettings()
LEASE_S = 5.0


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[JobStore]:
    store = open_job_store(f"sqlite:///{tmp_path}/jobs.db")
    store.migrate()
    store.put_avatar(AvatarRecord(AVATAR, "ann", 25.0, 10, 641, 481, 10, 1.0, tenant=TENANT))
    yield store
    store.close()


def request(**fields: object) -> SessionRequest:
    base = dict(
        avatar_id=AVATAR,
        sample_rate=0,
        codec=session_pb2.VIDEO_CODEC_UNSPECIFIED,
        max_height=0,
        fps=0.0,
        crf=0,
        jpeg_quality=0,
        super_resolution=False,
        max_session_seconds=0.0,
        idle_timeout_seconds=0.0,
    )
    return SessionRequest(**{**base, **fields})  # type: ignore[arg-type]


# -- a live worker standing in for services.live ----------------------------------------------------
class StandInWorker(live_pb2_grpc.LiveServiceServicer):
    """Holds sessions up to `capacity`, leasing each in the job store as a live worker does."""

    def __init__(self, worker_id: str, jobs: JobStore, capacity: int) -> None:
        self.id, self.jobs, self.capacity = worker_id, jobs, capacity
        self.sessions: dict[str, str] = {}  # id -> tenant
        self.opened: list[tuple[str, str, bool]] = []  # (session id, tenant, resume) per OpenSession
        self.starts: list[
            tuple[session_pb2.ConverseStart, str]
        ] = []  # what each Converse began with, and its tenant metadata
        self.refuse_open: grpc.StatusCode | None = None
        self.asked = 0  # OpenSession calls, refused or not
        self.streams_ended = 0  # Converse streams over, however they ended
        self.hang = False  # take Converse streams and never answer
        self.server: grpc.aio.Server | None = None
        self.address = ""

    async def start(self) -> None:
        self.server = grpc.aio.server()
        live_pb2_grpc.add_LiveServiceServicer_to_server(self, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        await self.server.start()
        await self.heartbeat()

    async def heartbeat(self, draining: bool = False) -> None:
        await self.jobs.heartbeat_live_worker(self.id, self.address, self.capacity, len(self.sessions), draining)

    async def kill(self) -> None:
        """Gone at once (its heartbeat row stays, fresh, as after a kill -9)."""
        assert self.server is not None
        await self.server.stop(None)

    async def restart(self) -> None:
        """Up again on the same address, holding nothing, heartbeating (a container restarted in its pod)."""
        self.sessions.clear()
        self.server = grpc.aio.server()
        live_pb2_grpc.add_LiveServiceServicer_to_server(self, self.server)
        assert self.server.add_insecure_port(self.address)
        await self.server.start()
        await self.heartbeat()

    async def OpenSession(
        self, request: live_pb2.OpenSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        self.asked += 1
        if self.refuse_open is not None:
            await context.abort(self.refuse_open, f"{self.id} refuses")
        if len(self.sessions) >= self.capacity:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self.id} is full", trailing_metadata=(("retry-after-ms", "750"),)
            )
        if not await self.jobs.lease_session(request.session.id, self.id, LEASE_S):
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"session {request.session.id} is held by another worker"
            )
        self.sessions[request.session.id] = request.tenant
        self.opened.append((request.session.id, request.tenant, request.resume))
        return request.session

    async def Converse(
        self, request_iterator: AsyncIterator[session_pb2.ConverseRequest], context: grpc.aio.ServicerContext
    ):  # type: ignore[no-untyped-def]
        start = (await anext(request_iterator)).start
        if self.hang:
            await asyncio.sleep(60)
        tenant = dict(context.invocation_metadata()).get("x-lipline-tenant", "")
        self.starts.append((start, tenant))
        if self.sessions.get(start.session_id) != tenant:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"session {start.session_id} is not held here")
        index = start.last_frame + 1
        context.add_done_callback(lambda _: setattr(self, "streams_ended", self.streams_ended + 1))
        yield session_pb2.ConverseResponse(
            ready=session_pb2.Ready(session=session_pb2.Session(id=start.session_id), next_frame=index)
        )
        async for message in request_iterator:
            if message.HasField("end_of_utterance"):
                return
            if message.audio.pcm == b"flood":  # as a worker refuses audio beyond its bound
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "queued audio over 2 s",
                    trailing_metadata=(("retry-after-ms", "500"),),
                )
            yield session_pb2.ConverseResponse(
                frame=session_pb2.VideoFrame(index=index, audio=message.audio.pcm, speech=True)
            )
            index += 1

    async def CloseSession(
        self, request: session_pb2.CloseSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        self.sessions.pop(request.session_id, None)
        await self.jobs.end_session(request.session_id, self.id, SessionState.CLOSED, "closed by CloseSession", 0)
        return session_pb2.Session(id=request.session_id)


@dataclasses.dataclass
class Cluster:
    jobs: JobStore
    live: LiveWorkers
    workers: dict[str, StandInWorker]

    async def create(self, tenant: str = TENANT, **fields: object) -> tuple[str, str]:
        row, token = await create_session(self.jobs, self.live, SETTINGS, request(**fields), tenant, "req-1")
        return row.id, token

    async def talk(
        self, session_id: str, token: str, chunks: int = 3, last_frame: int = -1, tenant: str = TENANT
    ) -> list[session_pb2.ConverseResponse]:
        async def requests() -> AsyncIterator[session_pb2.ConverseRequest]:
            yield session_pb2.ConverseRequest(
                start=session_pb2.ConverseStart(session_id=session_id, resume_token=token, last_frame=last_frame)
            )
            for i in range(chunks):
                yield session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=bytes([i]) * 640))
            yield session_pb2.ConverseRequest(end_of_utterance=session_pb2.EndOfUtterance())

        return [r async for r in converse(self.jobs, self.live, requests(), tenant, "req-1")]


def with_workers(
    jobs: JobStore, capacities: dict[str, int], test: Callable[[Cluster], Awaitable[T]], open_timeout_s: float = 5.0
) -> T:
    async def run() -> T:
        workers = {name: StandInWorker(name, jobs, capacity) for name, capacity in capacities.items()}
        for worker in workers.values():
            await worker.start()
        live = LiveWorkers(
            jobs, SETTINGS.max_message_bytes, fresh_s=5.0, open_timeout_s=open_timeout_s, retry_after_ms=2000
        )
        try:
            return await test(Cluster(jobs, live, workers))
        finally:
            await live.close()
            for worker in workers.values():
                with contextlib.suppress(Exception):
                    await worker.kill()

    return asyncio.run(run())


# -- resolving a request ------------------------------------------------------------------------------
def test_output_size_keeps_the_aspect_in_even_sides_never_larger() -> None:
    assert output_size(641, 481, 0) == (640, 480)
    assert output_size(641, 481, 1080) == (640, 480)  # never scaled up
    assert output_size(1280, 720, 360) == (640, 360)
    assert output_size(512, 512, 255) == (254, 254)
    assert output_size(3, 2, 0) == (2, 2)


def test_a_request_is_resolved_with_the_avatars_size_and_the_deployments_defaults() -> None:
    avatar = AvatarRecord(AVATAR, "ann", 30.0, 10, 641, 481, 10, 1.0, tenant=TENANT)
    session = resolve_session(request(), avatar, SETTINGS, "s1")
    assert (session.id, session.avatar_id, session.state) == ("s1", AVATAR, session_pb2.SESSION_STATE_ACTIVE)
    assert (session.audio.sample_rate, session.video.codec, session.video.fps) == (
        16000,
        session_pb2.VIDEO_CODEC_H264,
        30.0,
    )
    assert (session.video.crf, session.video.jpeg_quality, session.width, session.height) == (23, 85, 640, 480)
    assert (session.limits.max_session_seconds, session.limits.idle_timeout_seconds) == (
        SETTINGS.max_session_seconds,
        SETTINGS.session_idle_timeout_s,
    )
    asked = resolve_session(
        request(
            sample_rate=48000,
            codec=session_pb2.VIDEO_CODEC_JPEG,
            max_height=240,
            fps=12.5,
            jpeg_quality=60,
            max_session_seconds=30,
            idle_timeout_seconds=5,
            super_resolution=True,
        ),
        avatar,
        SETTINGS,
        "s2",
    )
    assert (asked.audio.sample_rate, asked.video.codec, asked.width, asked.height, asked.video.fps) == (
        48000,
        session_pb2.VIDEO_CODEC_JPEG,
        320,
        240,
        12.5,
    )
    assert (
        asked.video.jpeg_quality,
        asked.limits.max_session_seconds,
        asked.limits.idle_timeout_seconds,
        asked.super_resolution,
    ) == (60, 30, 5, True)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sample_rate": 44100}, "sample_rate 44100 is not one of 16000, 24000, 48000"),
        ({"codec": 7}, "codec 7 is not one of"),
        ({"max_height": 16}, "max_height 16 is below 32"),
        ({"fps": 61.0}, "fps 61 is outside 1..60"),
        ({"fps": 0.5}, "fps 0.5 is outside"),
        ({"crf": 52}, "crf 52 is outside 0..51"),
        ({"jpeg_quality": 101}, "jpeg_quality 101 is outside 1..100"),
        ({"max_session_seconds": 3601.0}, "max_session_seconds 3601 is outside 0..3600"),
        ({"max_session_seconds": -1.0}, "max_session_seconds -1 is outside"),
        ({"idle_timeout_seconds": 61.0}, "idle_timeout_seconds 61 is outside 0..60"),
    ],
)
def test_a_request_out_of_range_is_invalid_and_says_what_may_be(fields: dict, message: str) -> None:
    avatar = AvatarRecord(AVATAR, "ann", 25.0, 10, 641, 481, 10, 1.0, tenant=TENANT)
    with pytest.raises(InvalidRequest, match=message.replace("(", r"\(").replace(".", r"\.")):
        resolve_session(request(**fields), avatar, SETTINGS, "s1")


def test_the_resume_token_is_checked_against_its_sha256_only() -> None:
    assert token_matches("secret", token_sha256("secret")) and not token_matches("Secret", token_sha256("secret"))


# -- placement ----------------------------------------------------------------------------------------
def test_a_session_goes_to_the_worker_with_most_room_and_only_the_tokens_hash_is_stored(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        sid, token = await c.create()
        row = await jobs.get_session(TENANT, sid)
        assert (row.worker_id, row.worker_address, row.lease_live) == ("roomy", c.workers["roomy"].address, True)
        assert c.workers["roomy"].opened == [(sid, TENANT, False)]
        assert row.resume_token_sha256 == token_sha256(token) and len(token) >= 40
        stored = session_pb2.Session.FromString(row.session)
        assert stored.resume_token == "" and (stored.width, stored.height) == (640, 480)
        public = session_to_proto(row, token)
        assert (public.id, public.resume_token, public.state) == (sid, token, session_pb2.SESSION_STATE_ACTIVE)
        assert public.create_time.ToNanoseconds() > 0

    with_workers(jobs, {"small": 1, "roomy": 3}, test)


def test_a_full_worker_is_passed_over_and_with_no_room_anywhere_the_row_goes(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        first, _ = await c.create()
        second, _ = await c.create()  # a's heartbeat still says 0 active, but its lease counts: b
        assert {(await jobs.get_session(TENANT, s)).worker_id for s in (first, second)} == {"a", "b"}
        # Both full by their leases: no worker is even asked.
        with pytest.raises(
            NoCapacity, match=r"no live worker has room for a session now \(2 available, 2 full\); retry in 2000 ms"
        ) as err:
            await c.create()
        assert err.value.trailing_metadata() == (("retry-after-ms", "2000"),)
        assert jobs.purgeable_avatars() == []
        assert len(c.workers["a"].opened) == len(c.workers["b"].opened) == 1

    with_workers(jobs, {"a": 1, "b": 1}, test)


def test_a_worker_that_is_fuller_than_its_heartbeat_says_answers_for_itself(jobs: JobStore) -> None:
    """Another gateway filled it since its heartbeat: it refuses RESOURCE_EXHAUSTED with its hint,
    the next worker is tried, and when none is left the hint is the worker's."""

    async def test(c: Cluster) -> None:
        a = c.workers["a"]
        a.sessions["elsewhere"] = TENANT  # held without a row this gateway knows about
        with pytest.raises(NoCapacity, match=r"refused by a RESOURCE_EXHAUSTED\); retry in 750 ms") as err:
            await c.create()
        assert err.value.retry_after_ms == 750
        assert sorted(r[0] for r in jobs._transaction(lambda tx: tx.query("SELECT id FROM live_sessions"))) == []  # type: ignore[attr-defined]

    with_workers(jobs, {"a": 1}, test)


def test_a_worker_full_only_by_a_heartbeat_a_second_old_is_asked(jobs: JobStore) -> None:
    """Its sessions closed since its last heartbeat: the store's leases say it has room, and it does."""

    async def test(c: Cluster) -> None:
        a = c.workers["a"]
        await jobs.heartbeat_live_worker("a", a.address, 2, 2, False)
        sid, _ = await c.create()
        assert (await jobs.get_session(TENANT, sid)).worker_id == "a"

    with_workers(jobs, {"a": 2}, test)


def test_draining_and_dead_workers_are_skipped(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        await c.workers["drain"].heartbeat(draining=True)
        await c.workers["dead"].kill()  # its heartbeat is fresh; it answers UNAVAILABLE
        sid, _ = await c.create()
        assert (await jobs.get_session(TENANT, sid)).worker_id == "alive"
        assert c.workers["drain"].opened == []

    with_workers(jobs, {"dead": 9, "drain": 8, "alive": 1}, test)


def test_a_workers_own_refusal_reaches_the_caller_and_leaves_no_row(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        c.workers["a"].refuse_open = grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(LiveWorkerError, match="a refuses") as err:
            await c.create()
        assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
        jobs.delete_avatar(AVATAR, TENANT)
        assert jobs.purgeable_avatars() == [AVATAR]  # no session row holds it

    with_workers(jobs, {"a": 2}, test)


def test_another_tenants_avatar_makes_no_session(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        with pytest.raises(NotFound, match="avatar"):
            await c.create(tenant="globex")
        assert c.workers["a"].opened == []

    with_workers(jobs, {"a": 2}, test)


# -- Converse -----------------------------------------------------------------------------------------
def test_converse_relays_both_ways_with_the_tenant_and_without_the_token(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        sid, token = await c.create()
        responses = await c.talk(sid, token, chunks=3)
        assert responses[0].ready.next_frame == 0
        frames = [r.frame for r in responses[1:]]
        assert [(f.index, f.audio) for f in frames] == [(i, bytes([i]) * 640) for i in range(3)]
        ((start, tenant),) = c.workers["a"].starts
        assert (start.session_id, start.resume_token, start.last_frame, tenant) == (sid, "", -1, TENANT)

    with_workers(jobs, {"a": 2}, test)


def test_converse_refuses_a_bad_start_a_wrong_token_another_tenant_and_an_ended_session(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        sid, token = await c.create()

        async def only(*messages: session_pb2.ConverseRequest) -> AsyncIterator[session_pb2.ConverseRequest]:
            for m in messages:
                yield m

        audio = session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=b"\0\0"))
        for messages, got in (
            ((audio,), "got a audio message"),
            ((), "got no message"),
            ((session_pb2.ConverseRequest(),), "got an empty message"),
        ):
            with pytest.raises(InvalidRequest, match=f"must be ConverseStart .*, {got}"):
                [r async for r in converse(jobs, c.live, only(*messages), TENANT)]
        with pytest.raises(PermissionDenied, match=f"does not match session {sid}"):
            await c.talk(sid, token + "x")
        with pytest.raises(NotFound):
            await c.talk(sid, token, tenant="globex")
        with pytest.raises(NotFound):
            await c.talk("no-such-id!", token)
        closed = await close_session(jobs, c.live, TENANT, sid)
        assert (closed.state, closed.error) == (SessionState.CLOSED, "closed by CloseSession")
        assert c.workers["a"].sessions == {}  # the worker was told
        with pytest.raises(FailedPrecondition, match=f"session {sid} is SESSION_STATE_CLOSED: closed by CloseSession"):
            await c.talk(sid, token)
        assert len(c.workers["a"].starts) == 0  # none of these reached the worker

    with_workers(jobs, {"a": 2}, test)


def test_a_resume_from_a_frame_the_session_cannot_have_made_is_refused(jobs: JobStore) -> None:
    """The session's clock runs from its create_time (frame k due k / fps after it, on any worker): a
    last_frame past the frame due now (and CLOCK_SLACK_S for machines' clocks) or below -1 is
    INVALID_ARGUMENT, before a resume could place the session anywhere."""

    async def test(c: Cluster) -> None:
        sid, token = await c.create()
        for bad in (10**12, 25 * 10, -2):  # 10 s of frames ahead of a session made a moment ago
            with pytest.raises(InvalidRequest, match=f"last_frame {bad} is not a frame session {sid} has sent"):
                await c.talk(sid, token, last_frame=bad)
        assert c.workers["a"].starts == []
        row = await jobs.get_session(TENANT, sid)
        check_last_frame(row, 25 * 60, now=row.create_time + 60)  # a minute on: frame 1,500 was made
        with pytest.raises(InvalidRequest, match="its clock is at frame 1500 at 25 fps"):
            check_last_frame(row, 25 * 62, now=row.create_time + 60)
        responses = await c.talk(sid, token, last_frame=5)
        assert responses[0].ready.next_frame == 6

    with_workers(jobs, {"a": 2}, test)


def test_a_second_start_on_a_stream_ends_it(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        sid, token = await c.create()
        start = session_pb2.ConverseRequest(start=session_pb2.ConverseStart(session_id=sid, resume_token=token))

        async def requests() -> AsyncIterator[session_pb2.ConverseRequest]:
            yield start
            yield start

        with pytest.raises(InvalidRequest, match="ConverseStart comes once"):
            [r async for r in converse(jobs, c.live, requests(), TENANT)]

    with_workers(jobs, {"a": 2}, test)


def test_a_resume_after_the_worker_died_lands_on_another_and_continues(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        sid, token = await c.create()
        first = c.workers["a"]
        assert (await jobs.get_session(TENANT, sid)).worker_id == "a"
        await c.workers["b"].heartbeat()
        await first.kill()  # its lease is still live: it answers UNAVAILABLE at the start
        responses = await c.talk(sid, token, chunks=2, last_frame=11)  # within the session's first second
        assert responses[0].ready.next_frame == 12 and [r.frame.index for r in responses[1:]] == [12, 13]
        assert c.workers["b"].opened == [(sid, TENANT, True)]
        assert (await jobs.get_session(TENANT, sid)).worker_id == "b"

    with_workers(jobs, {"a": 5, "b": 1}, test)


def test_a_resume_with_an_expired_lease_is_placed_without_asking_the_old_worker(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        sid, token = await c.create()
        await jobs.release_session(sid, "a")  # as a lease that ran out: nobody holds it
        responses = await c.talk(sid, token, chunks=1)
        assert [r.frame.index for r in responses[1:]] == [0]
        assert c.workers["a"].starts == [
            (session_pb2.ConverseStart(session_id=sid, last_frame=-1), TENANT)
        ]  # via OpenSession(resume) again
        assert c.workers["a"].opened[-1] == (sid, TENANT, True)

    with_workers(jobs, {"a": 2}, test)


def test_a_resume_with_no_worker_left_is_refused_and_the_session_waits(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        sid, token = await c.create()
        await c.workers["a"].kill()
        with pytest.raises(NoCapacity, match="refused by a UNAVAILABLE"):
            await c.talk(sid, token)
        row = await jobs.get_session(TENANT, sid)
        assert row.active and not row.lease_live  # a worker that starts later may take it

    with_workers(jobs, {"a": 2}, test)


def test_a_worker_restarted_on_its_address_takes_a_session_at_once(jobs: JobStore) -> None:
    """The gateway's channel to it failed while it was down and is in its reconnect back-off when it is
    up again: the gateway waits for the channel rather than refusing the session."""

    async def test(c: Cluster) -> None:
        a = c.workers["a"]
        await c.create()  # the channel is connected
        await a.kill()
        with pytest.raises(NoCapacity, match="refused by a UNAVAILABLE"):
            await c.create()  # the calls while it is down start the back-off
        await asyncio.sleep(1.5)  # the channel tries again and again: its back-off grows to its longest
        await a.restart()
        sid, _ = await c.create()  # at once: within the back-off
        assert (await jobs.get_session(TENANT, sid)).worker_id == "a" and sid in a.sessions

    with_workers(jobs, {"a": 2}, test)


def test_a_worker_that_answers_unavailable_itself_is_asked_once(jobs: JobStore) -> None:
    """A draining worker's UNAVAILABLE comes over a connected channel: the gateway does not ask it again
    (the channel's own retry policy does, services/serving/channels.py: that many calls, no more)."""
    attempts = json.loads(SERVICE_CONFIG)["methodConfig"][0]["retryPolicy"]["maxAttempts"]

    async def test(c: Cluster) -> None:
        c.workers["a"].refuse_open = grpc.StatusCode.UNAVAILABLE
        with pytest.raises(NoCapacity, match="refused by a UNAVAILABLE"):
            await c.create()
        assert c.workers["a"].asked == attempts

    with_workers(jobs, {"a": 2}, test)


def test_close_marks_the_row_even_when_the_worker_is_gone(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        sid, _ = await c.create()
        await c.workers["a"].kill()
        closed = await close_session(jobs, c.live, TENANT, sid)
        assert closed.state == SessionState.CLOSED and not closed.lease_live
        with pytest.raises(NotFound):
            await close_session(jobs, c.live, "globex", sid)

    with_workers(jobs, {"a": 2}, test)


def test_a_workers_status_mid_stream_reaches_the_client_as_it_was(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        sid, token = await c.create()

        async def requests() -> AsyncIterator[session_pb2.ConverseRequest]:
            yield session_pb2.ConverseRequest(start=session_pb2.ConverseStart(session_id=sid, resume_token=token))
            yield session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=b"\0\0"))
            yield session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=b"flood"))
            await asyncio.sleep(30)  # the client would go on: the worker's status ends the stream

        got = []
        with pytest.raises(LiveWorkerError, match="queued audio over 2 s") as err:
            async for response in converse(jobs, c.live, requests(), TENANT):
                got.append(response.WhichOneof("response"))
        assert got == ["ready", "frame"]
        assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED and err.value.trailing_metadata() == (
            ("retry-after-ms", "500"),
        )

    with_workers(jobs, {"a": 2}, test)


def test_a_client_that_goes_away_cancels_the_workers_stream(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        sid, token = await c.create()

        async def requests() -> AsyncIterator[session_pb2.ConverseRequest]:
            yield session_pb2.ConverseRequest(start=session_pb2.ConverseStart(session_id=sid, resume_token=token))
            await asyncio.sleep(30)

        stream = converse(jobs, c.live, requests(), TENANT)
        assert (await anext(stream)).WhichOneof("response") == "ready"
        reading = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.2)
        reading.cancel()  # what gRPC does to the handler when the client cancels
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        await stream.aclose()
        for _ in range(100):
            if c.workers["a"].streams_ended:
                break
            await asyncio.sleep(0.02)
        assert c.workers["a"].streams_ended == 1  # at once: its client had 30 s of nothing left to send

    with_workers(jobs, {"a": 2}, test)


def test_a_worker_that_never_answers_the_start_loses_the_session(jobs: JobStore) -> None:
    async def test(c: Cluster) -> None:
        sid, token = await c.create()
        hung = c.workers[(await jobs.get_session(TENANT, sid)).worker_id]
        hung.hang = True
        other = next(w for w in c.workers.values() if w is not hung)
        await other.heartbeat()
        responses = await c.talk(sid, token, chunks=1)
        assert [r.frame.index for r in responses[1:]] == [0]
        assert other.opened == [(sid, TENANT, True)] and (await jobs.get_session(TENANT, sid)).worker_id == other.id

    with_workers(jobs, {"a": 2, "b": 1}, test, open_timeout_s=0.5)
