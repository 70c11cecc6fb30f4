"""Live sessions and live workers in the job store (services/jobs/store/sessions.py): leases that one
worker wins, expire and move; heartbeats the gateway places by; tenants; sessions holding avatars.

Each test runs on SQLite and on a real PostgreSQL (conftest.py). The methods are coroutines; each
test drives them with asyncio.run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import pytest

from services.jobs.store.jobs import AvatarRecord, JobStore
from services.jobs.store.sessions import FOREVER, SessionState
from services.jobs.store.sql.schema import SCHEMA_VERSION, migration, schema
from services.serving.errors import NotFound, TooLarge
from tests.unit.jobs.store.test_jobs import sql

AVATAR = "a" * 24
SHORT_LEASE = 0.3
DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]


def avatar(avatar_id: str = AVATAR, tenant: str = "acme") -> AvatarRecord:
    return AvatarRecord(avatar_id, "n", 25.0, 1, 64, 64, 1, 1.0, tenant=tenant, content_hash=avatar_id)


def new_session(store: JobStore, session_id: str, tenant: str = "acme", avatar_id: str = AVATAR, **limits: float):
    return asyncio.run(store.create_session(tenant, session_id, avatar_id, b"\x0a\x02s1\x00\xff", "d" * 64, **limits))


def test_a_created_session_is_active_unleased_and_keeps_its_bytes(job_store: JobStore) -> None:
    job_store.put_avatar(avatar())
    row = new_session(job_store, "s1", max_seconds=60, idle_timeout_s=5)
    assert (row.id, row.tenant, row.avatar_id, row.state) == ("s1", "acme", AVATAR, SessionState.ACTIVE)
    assert row.session == b"\x0a\x02s1\x00\xff" and row.resume_token_sha256 == "d" * 64  # NUL bytes survive
    assert (row.worker_id, row.worker_address, row.lease_live) == ("", "", False)
    assert row.deadline == pytest.approx(row.create_time + 60) and row.idle_timeout_s == 5
    unlimited = new_session(job_store, "s2")
    assert (unlimited.deadline, unlimited.idle_timeout_s) == (FOREVER, FOREVER)
    assert asyncio.run(job_store.get_session("acme", "s1")) == asyncio.run(job_store.get_session_row("s1"))


def test_the_gateway_sees_only_its_tenants_sessions(job_store: JobStore) -> None:
    job_store.put_avatar(avatar())
    job_store.put_avatar(avatar("b" * 24, "bob"))
    new_session(job_store, "s1")
    with pytest.raises(NotFound, match="avatar"):  # another tenant's avatar: no session on it
        new_session(job_store, "s-bob", tenant="bob")
    for call in (
        job_store.get_session("bob", "s1"),
        job_store.close_session("bob", "s1"),
        job_store.get_session("acme", "nope"),
    ):
        with pytest.raises(NotFound, match="session '(s1|nope)' does not exist"):
            asyncio.run(call)
    asyncio.run(job_store.delete_session("bob", "s1"))  # another tenant's delete changes nothing
    assert asyncio.run(job_store.get_session("acme", "s1")).active
    assert asyncio.run(job_store.get_session_row("s1")).tenant == "acme"  # the workers' view: any tenant
    with pytest.raises(NotFound):
        asyncio.run(job_store.get_session_row("nope"))
    asyncio.run(job_store.delete_session("acme", "s1"))
    with pytest.raises(NotFound):
        asyncio.run(job_store.get_session_row("s1"))


def test_a_deleted_avatar_takes_no_session_and_a_live_session_holds_its_avatar(job_store: JobStore) -> None:
    job_store.put_avatar(avatar())
    new_session(job_store, "s1")
    job_store.delete_avatar(AVATAR, "acme")
    with pytest.raises(NotFound, match="avatar"):
        new_session(job_store, "s2")
    assert job_store.purgeable_avatars() == [] and not job_store.forget_avatar(AVATAR)  # s1 still uses it
    closed = asyncio.run(job_store.close_session("acme", "s1"))
    assert (closed.state, closed.error, closed.lease_live) == (SessionState.CLOSED, "closed by CloseSession", False)
    assert job_store.purgeable_avatars() == [AVATAR] and job_store.forget_avatar(AVATAR)


def test_an_orphaned_session_ends_by_itself_and_frees_its_avatar(job_store: JobStore) -> None:
    """A session nobody holds for its idle timeout (its worker died, no client resumed) or past its
    deadline is CLOSED when read, with a message saying which; it holds its avatar no longer."""
    job_store.put_avatar(avatar())
    assert asyncio.run(job_store.lease_session(new_session(job_store, "idle", idle_timeout_s=0.4).id, "w1", 0.1))
    new_session(job_store, "old", max_seconds=0.4)
    job_store.delete_avatar(AVATAR, "acme")
    assert job_store.purgeable_avatars() == []
    time.sleep(0.6)
    assert job_store.purgeable_avatars() == [AVATAR]
    idle = asyncio.run(job_store.get_session("acme", "idle"))
    assert (idle.state, idle.error_code) == (SessionState.CLOSED, DEADLINE_EXCEEDED)
    assert "idle timeout" in idle.error and idle.end_time > 0
    old = asyncio.run(job_store.get_session_row("old"))
    assert old.state == SessionState.CLOSED and "limit of 0.4 s (max_session_seconds)" in old.error
    assert not asyncio.run(job_store.lease_session("old", "w1", 5))
    assert asyncio.run(job_store.renew_session_leases("w1", ["idle"], 5)) == set()


def test_a_tenant_may_hold_at_most_its_share_of_sessions(job_store: JobStore) -> None:
    job_store.put_avatar(avatar())
    job_store.put_avatar(avatar("b" * 24, "bob"))
    new_session(job_store, "s1", max_per_tenant=2)
    new_session(job_store, "s2", max_per_tenant=2)
    with pytest.raises(TooLarge, match="tenant 'acme' has 2 live sessions open \\(limit 2\\)"):
        new_session(job_store, "s3", max_per_tenant=2)
    new_session(job_store, "b1", tenant="bob", avatar_id="b" * 24, max_per_tenant=2)  # bob's count is his own
    asyncio.run(job_store.close_session("acme", "s1"))
    new_session(job_store, "s3", max_per_tenant=2)


def test_a_lease_is_taken_when_free_expired_or_ours_and_moves_when_released(job_store: JobStore) -> None:
    job_store.put_avatar(avatar())
    new_session(job_store, "s1")
    asyncio.run(job_store.heartbeat_live_worker("w1", "10.0.0.1:50056", 4, 0, False))
    assert asyncio.run(job_store.lease_session("s1", "w1", SHORT_LEASE))
    row = asyncio.run(job_store.get_session("acme", "s1"))
    assert (row.worker_id, row.worker_address, row.lease_live) == ("w1", "10.0.0.1:50056", True)
    assert not asyncio.run(job_store.lease_session("s1", "w2", 60))  # w1 holds it
    assert asyncio.run(job_store.lease_session("s1", "w1", SHORT_LEASE))  # ours already: renewed
    time.sleep(SHORT_LEASE + 0.1)
    row = asyncio.run(job_store.get_session_row("s1"))
    assert row.active and not row.lease_live  # expired: another worker may take it (a resume)
    assert asyncio.run(job_store.lease_session("s1", "w2", 60))
    assert asyncio.run(job_store.renew_session_leases("w1", ["s1"], 60)) == set()  # w1 lost it: it drops it
    assert not asyncio.run(job_store.release_session("s1", "w1"))  # only the holder may give it up
    assert asyncio.run(job_store.release_session("s1", "w2"))
    assert not asyncio.run(job_store.get_session_row("s1")).lease_live
    assert asyncio.run(job_store.lease_session("s1", "w3", 60))  # at once, without waiting for an expiry


def test_renew_extends_only_this_workers_live_sessions(job_store: JobStore) -> None:
    job_store.put_avatar(avatar())
    for sid in ("a", "b", "c", "d"):
        new_session(job_store, sid)
    for sid, worker in (("a", "w1"), ("b", "w1"), ("c", "w2"), ("d", "w1")):
        assert asyncio.run(job_store.lease_session(sid, worker, SHORT_LEASE))
    assert asyncio.run(job_store.end_session("d", "w1", SessionState.CLOSED, "idle timeout", DEADLINE_EXCEEDED))
    assert asyncio.run(job_store.renew_session_leases("w1", ["a", "b", "c", "d", "unknown", "a"], 60)) == {"a", "b"}
    assert asyncio.run(job_store.renew_session_leases("w1", [], 60)) == set()
    time.sleep(SHORT_LEASE + 0.1)
    rows = {sid: asyncio.run(job_store.get_session_row(sid)) for sid in ("a", "b", "c")}
    assert (rows["a"].lease_live, rows["b"].lease_live, rows["c"].lease_live) == (True, True, False)
    # An expired lease nobody took is still its worker's: renewing it loses nothing.
    assert asyncio.run(job_store.renew_session_leases("w2", ["c"], 60)) == {"c"}


def test_a_session_ends_only_by_its_holder_and_stays_ended(job_store: JobStore) -> None:
    job_store.put_avatar(avatar())
    new_session(job_store, "s1")
    assert asyncio.run(job_store.lease_session("s1", "w1", 60))
    assert not asyncio.run(job_store.end_session("s1", "w2", SessionState.FAILED, "not mine", FAILED_PRECONDITION))
    assert asyncio.run(
        job_store.end_session("s1", "w1", SessionState.FAILED, "the avatar's data is gone", FAILED_PRECONDITION)
    )
    assert not asyncio.run(job_store.end_session("s1", "w1", SessionState.CLOSED, "again", 0))
    row = asyncio.run(job_store.get_session("acme", "s1"))
    assert (row.state, row.error, row.error_code, row.lease_live) == (
        SessionState.FAILED,
        "the avatar's data is gone",
        FAILED_PRECONDITION,
        False,
    )
    assert not asyncio.run(job_store.lease_session("s1", "w1", 60))  # an ended session is never leased again
    assert (
        asyncio.run(job_store.close_session("acme", "s1")).state == SessionState.FAILED
    )  # closing an ended one changes nothing
    with pytest.raises(ValueError):
        asyncio.run(job_store.end_session("s1", "w1", SessionState.ACTIVE, "", 0))


def test_racing_workers_each_session_has_one_winner(open_store: Callable[[], JobStore], job_store: JobStore) -> None:
    """Three workers (each its own store, as separate processes would have) race for the same 20
    sessions at once: every session is leased by exactly one of them."""
    job_store.put_avatar(avatar())
    sessions = [f"s{i}" for i in range(20)]
    for sid in sessions:
        new_session(job_store, sid)
    workers = {f"w{i}": open_store() for i in range(3)}

    async def race() -> dict[str, list[str]]:
        async def take(worker: str, store: JobStore) -> list[str]:
            won = await asyncio.gather(*(store.lease_session(sid, worker, 60) for sid in sessions))
            return [sid for sid, ok in zip(sessions, won) if ok]

        results = await asyncio.gather(*(take(w, s) for w, s in workers.items()))
        return dict(zip(workers, results))

    wins = asyncio.run(race())
    assert sorted(sid for won in wins.values() for sid in won) == sorted(sessions)
    for worker, won in wins.items():
        assert all(asyncio.run(job_store.get_session_row(sid)).worker_id == worker for sid in won)


def test_live_workers_are_the_fresh_not_draining_ones_most_room_first(job_store: JobStore) -> None:
    job_store.put_avatar(avatar())
    beat = job_store.heartbeat_live_worker
    asyncio.run(beat("w-full", "h:1", 2, 2, False))
    asyncio.run(beat("w-roomy", "h:2", 8, 1, False))
    asyncio.run(beat("w-drain", "h:3", 8, 0, True))
    asyncio.run(beat("w-some", "h:4", 4, 0, False))
    for sid in ("s1", "s2"):  # placed on w-some since its last heartbeat: they count already
        new_session(job_store, sid)
        assert asyncio.run(job_store.lease_session(sid, "w-some", 60))
    workers = asyncio.run(job_store.live_workers(fresh_s=5))
    assert [(w.id, w.address, w.room, w.leased) for w in workers] == [
        ("w-roomy", "h:2", 7, 0),
        ("w-some", "h:4", 2, 2),
        ("w-full", "h:1", 0, 0),
    ]
    assert [w.free_by_leases for w in workers] == [8, 2, 2]  # w-full is full by its heartbeat only
    asyncio.run(beat("w-roomy", "h:22", 8, 8, False))  # an upsert: the same row, new figures
    assert [(w.id, w.address, w.room) for w in asyncio.run(job_store.live_workers(fresh_s=5))][-1] == (
        "w-roomy",
        "h:22",
        0,
    )
    time.sleep(0.4)
    asyncio.run(beat("w-some", "h:4", 4, 2, False))
    assert [w.id for w in asyncio.run(job_store.live_workers(fresh_s=0.3))] == [
        "w-some"
    ]  # the others' heartbeats are stale
    asyncio.run(job_store.remove_live_worker("w-some"))
    assert asyncio.run(job_store.live_workers(fresh_s=0.3)) == []
    assert asyncio.run(job_store.get_session_row("s1")).worker_address == ""  # its worker's row is gone


def test_a_version_6_database_gets_the_session_tables(open_store: Callable[[], JobStore], store_url: str) -> None:
    store = open_store()

    def make_version_6(tx) -> None:  # type: ignore[no-untyped-def]  # what lipline with schema 6 left behind
        for statement in schema(store.blob_type):  # type: ignore[attr-defined]
            tx.execute(statement)
        for version in range(2, 7):
            for statement in migration(version, store.blob_type):  # type: ignore[attr-defined]
                tx.execute(statement)
        tx.execute("INSERT INTO schema_version (version) VALUES (6)")

    store._transaction(make_version_6)  # type: ignore[attr-defined]
    store.migrate()
    store.migrate()  # idempotent
    assert sql(store_url, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    store.put_avatar(avatar())
    assert new_session(store, "s1").active
    assert sql(store_url, "SELECT count(*) FROM live_sessions") == [(1,)]
