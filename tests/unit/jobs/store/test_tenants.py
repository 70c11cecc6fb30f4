"""Tenants in the job store (issue 17): every gateway-facing read and change finds only the given
tenant's rows; avatars dedup within a tenant only; a deleted avatar is hidden at once and purgeable
only once no active job uses it; schema 3's migration gives old rows the implicit tenant.

Each test runs on SQLite and on a real PostgreSQL (conftest.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from services.jobs.store.jobs import AvatarRecord, JobState, JobStore, NewJob
from services.jobs.store.sql.schema import MIGRATIONS, SCHEMA_VERSION, schema
from services.serving.errors import NotFound
from services.serving.tenants import IMPLICIT_TENANT
from tests.unit.jobs.store.test_jobs import sql


def job(job_id: str, tenant: str, avatar_id: str = "a" * 24) -> NewJob:
    return NewJob(job_id, avatar_id, f"tenant:{tenant}", b"", 0.8, 25.0, 20, [(0, 10), (10, 20)], tenant=tenant)


def avatar(avatar_id: str, tenant: str, digest: str = "c" * 24, name: str = "n", t: float = 1.0) -> AvatarRecord:
    return AvatarRecord(avatar_id, name, 25.0, 1, 64, 64, 1, t, tenant=tenant, content_hash=digest)


def test_another_tenants_job_is_not_found_for_get_and_cancel(job_store: JobStore) -> None:
    job_store.create_job(job("j1", "acme"))
    assert job_store.get_job("j1", "acme").tenant == "acme"
    assert job_store.get_job("j1").id == "j1"  # the render workers' view: any tenant
    with pytest.raises(NotFound, match="'j1' does not exist"):
        job_store.get_job("j1", "bob")
    with pytest.raises(NotFound):
        job_store.cancel_job("j1", "bob")
    assert job_store.get_job("j1").state == JobState.QUEUED  # bob's cancel changed nothing
    assert job_store.cancel_job("j1", "acme").state == JobState.CANCELLED


def test_avatars_are_per_tenant_and_dedup_only_within_a_tenant(job_store: JobStore) -> None:
    a = job_store.put_avatar(avatar("a" * 24, "acme", name="acme's", t=1.0))
    b = job_store.put_avatar(avatar("b" * 24, "bob", name="bob's", t=2.0))  # same content, another tenant
    assert (a.id, b.id) == ("a" * 24, "b" * 24) and b.name == "bob's"
    assert [x.id for x in job_store.list_avatars(tenant="acme")] == ["a" * 24]
    assert [x.id for x in job_store.list_avatars(tenant="bob")] == ["b" * 24]
    assert job_store.list_avatars(tenant="carol") == []
    assert {x.id for x in job_store.list_avatars()} == {"a" * 24, "b" * 24}
    assert job_store.get_avatar("a" * 24, "acme") == a
    for aid, tenant in (("a" * 24, "bob"), ("b" * 24, "acme")):
        with pytest.raises(NotFound):
            job_store.get_avatar(aid, tenant)
        with pytest.raises(NotFound):
            job_store.delete_avatar(aid, tenant)
    assert job_store.find_avatar("acme", "c" * 24) == a and job_store.find_avatar("bob", "c" * 24) == b
    assert job_store.find_avatar("carol", "c" * 24) is None
    # A concurrent upload of the same bytes by acme lost the race: it gets acme's avatar back.
    assert job_store.put_avatar(avatar("d" * 24, "acme", name="again", t=3.0)) == a
    assert [x.id for x in job_store.list_avatars(tenant="acme")] == ["a" * 24]


def test_submit_checks_the_avatar_in_the_jobs_transaction(job_store: JobStore) -> None:
    job_store.put_avatar(avatar("a" * 24, "acme"))
    with pytest.raises(NotFound, match="avatar"):
        job_store.create_job(job("j-bob", "bob", "a" * 24), check_avatar=True)
    with pytest.raises(NotFound, match="avatar"):
        job_store.create_job(job("j-none", "acme", "e" * 24), check_avatar=True)
    assert job_store.create_job(job("j-acme", "acme", "a" * 24), check_avatar=True).tenant == "acme"
    job_store.delete_avatar("a" * 24, "acme")
    with pytest.raises(NotFound, match="avatar"):
        job_store.create_job(job("j-late", "acme", "a" * 24), check_avatar=True)
    for job_id in ("j-bob", "j-none", "j-late"):
        with pytest.raises(NotFound):
            job_store.get_job(job_id)


def test_a_deleted_avatar_is_hidden_at_once_and_purgeable_once_its_jobs_end(job_store: JobStore) -> None:
    job_store.put_avatar(avatar("a" * 24, "acme"))
    job_store.put_avatar(avatar("f" * 24, "acme", digest="9" * 24))
    job_store.create_job(job("j1", "acme", "a" * 24), check_avatar=True)
    job_store.delete_avatar("a" * 24, "acme")
    with pytest.raises(NotFound):
        job_store.get_avatar("a" * 24, "acme")
    with pytest.raises(NotFound):
        job_store.delete_avatar("a" * 24, "acme")
    assert [x.id for x in job_store.list_avatars(tenant="acme")] == ["f" * 24]
    assert job_store.find_avatar("acme", "c" * 24) is None
    assert job_store.get_job("j1").state == JobState.QUEUED  # the job keeps going
    assert job_store.purgeable_avatars() == [] and not job_store.forget_avatar("a" * 24)
    # The same upload again, while the old one waits for its purge: a new avatar of its own.
    assert job_store.put_avatar(avatar("b" * 24, "acme")).id == "b" * 24
    job_store.cancel_job("j1", "acme")
    assert job_store.purgeable_avatars() == ["a" * 24]
    assert job_store.purgeable_avatars(avatar_id="f" * 24) == []  # never a live avatar
    assert job_store.forget_avatar("a" * 24) and not job_store.forget_avatar("a" * 24)
    assert job_store.purgeable_avatars() == []
    assert job_store.get_job("j1").avatar_id == "a" * 24  # finished jobs keep their record


def test_a_submit_racing_a_delete_is_refused_or_counted_before_the_purge(
    open_store: Callable[[], JobStore], job_store: JobStore
) -> None:
    """Never a job created on an avatar whose data was purged (what a worker would then fail on)."""
    submitter, deleter = open_store(), open_store()
    for i in range(25):
        aid = f"{i:024x}"
        job_store.put_avatar(avatar(aid, "acme", digest=f"{i:024d}"))
        barrier, outcome = threading.Barrier(2), {}

        def submit() -> None:
            barrier.wait()
            try:
                submitter.create_job(job(f"j{i}", "acme", aid), check_avatar=True)
                outcome["created"] = True
            except NotFound:
                outcome["created"] = False

        def delete() -> None:
            barrier.wait()
            deleter.delete_avatar(aid, "acme")
            outcome["purged"] = aid in deleter.purgeable_avatars(avatar_id=aid) and deleter.forget_avatar(aid)

        threads = [threading.Thread(target=submit), threading.Thread(target=delete)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not (outcome["created"] and outcome["purged"]), f"round {i}: a job was created on a purged avatar"


def test_a_version_2_database_is_migrated_to_the_implicit_tenant(
    open_store: Callable[[], JobStore], store_url: str
) -> None:
    store = open_store()
    old_id = "0123456789abcdef01234567"  # before tenants an avatar's id was its content hash

    def make_version_2(tx) -> None:  # what lipline with schema 2 left behind
        for statement in schema(store.blob_type):
            tx.execute(statement)
        for statement in MIGRATIONS[2]:
            tx.execute(statement)
        tx.execute("INSERT INTO schema_version (version) VALUES (2)")
        tx.execute(
            "INSERT INTO jobs (id, avatar_id, owner, state, stage, options, audio_seconds, fps, total_frames, "
            "segments_total, create_time, trace_context) VALUES ('old', ?, '', 1, 'queued', ?, 2.0, 25.0, 50, 1, 1.0, '')",
            (old_id, b""),
        )
        tx.execute(
            "INSERT INTO avatars (id, name, fps, frame_count, width, height, faces_found, create_time) VALUES (?, 'ann', 25.0, 1, 64, 64, 1, 1.0)",
            (old_id,),
        )

    store._transaction(make_version_2)
    store.migrate()
    assert sql(store_url, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert store.get_job("old", IMPLICIT_TENANT).tenant == IMPLICIT_TENANT
    with pytest.raises(NotFound):
        store.get_job("old", "acme")
    old = store.get_avatar(old_id, IMPLICIT_TENANT)
    assert (old.name, old.tenant, old.content_hash) == ("ann", IMPLICIT_TENANT, old_id)
    assert store.find_avatar(IMPLICIT_TENANT, old_id) == old  # the same upload finds it again
    assert store.find_avatar("acme", old_id) is None
    store.migrate()  # idempotent
    assert store.create_job(job("new", "acme", old_id)).tenant == "acme"
