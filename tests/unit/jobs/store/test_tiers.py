"""Model tiers in the job store (issue 30): an avatar keeps the tier it was prepared for, a job its
avatar's; ListAvatars filters on it; schema 11's migration makes every older row Wav2Lip's.

Each test runs on SQLite and on a real PostgreSQL (conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable

from services.jobs.store.jobs import AvatarRecord, JobFilter, JobStore, NewJob, PageCursor
from services.jobs.store.sql.schema import MIGRATIONS, SCHEMA_VERSION, migration, schema
from services.serving.tenants import IMPLICIT_TENANT
from tests.unit.jobs.store.test_jobs import sql


def avatar(avatar_id: str, model: str, t: float, tenant: str = "acme") -> AvatarRecord:
    return AvatarRecord(avatar_id, "n", 25.0, 1, 64, 64, 1, t, tenant=tenant, content_hash=avatar_id, model=model)


def test_an_avatar_keeps_its_tier_and_the_list_filters_on_it(job_store: JobStore) -> None:
    a = job_store.put_avatar(avatar("a" * 24, "musetalk", 1.0))
    b = job_store.put_avatar(avatar("b" * 24, "wav2lip", 2.0))
    c = job_store.put_avatar(avatar("c" * 24, "musetalk", 3.0))
    job_store.put_avatar(avatar("d" * 24, "musetalk", 4.0, tenant="bob"))
    assert job_store.get_avatar(a.id, "acme").model == "musetalk" and b.model == "wav2lip"
    assert [x.id for x in job_store.list_avatars(tenant="acme")] == [c.id, b.id, a.id]
    assert [x.id for x in job_store.list_avatars(tenant="acme", model="musetalk")] == [c.id, a.id]
    assert [x.id for x in job_store.list_avatars(tenant="acme", model="wav2lip")] == [b.id]
    page = job_store.list_avatars(limit=1, tenant="acme", model="musetalk")
    assert [x.id for x in page] == [c.id]

    after = PageCursor(page[0].create_time, page[0].id)
    assert [x.id for x in job_store.list_avatars(tenant="acme", model="musetalk", after=after)] == [a.id]
    assert AvatarRecord("e" * 24, "n", 25.0, 1, 64, 64, 1, 5.0).model == "wav2lip"  # the default tier


def test_a_job_keeps_its_avatars_tier(job_store: JobStore) -> None:
    job_store.put_avatar(avatar("a" * 24, "musetalk", 1.0))
    new = NewJob("j1", "a" * 24, "tenant:acme", b"", 0.8, 25.0, 20, [(0, 20)], tenant="acme", model="musetalk")
    assert job_store.create_job(new, check_avatar=True).model == "musetalk"
    assert job_store.get_job("j1", "acme").model == "musetalk"
    assert job_store.list_jobs("acme", JobFilter())[0].model == "musetalk"
    plain = NewJob("j2", "a" * 24, "tenant:acme", b"", 0.8, 25.0, 20, [(0, 20)], tenant="acme")
    assert job_store.create_job(plain).model == "wav2lip"


def test_a_version_10_database_makes_every_row_wav2lips(open_store: Callable[[], JobStore], store_url: str) -> None:
    store = open_store()

    def make_version_10(tx) -> None:  # what lipline with schema 10 left behind
        for statement in schema(store.blob_type):
            tx.execute(statement)
        for version in range(2, 11):
            for statement in migration(version, store.blob_type):
                tx.execute(statement)
        tx.execute("INSERT INTO schema_version (version) VALUES (10)")
        tx.execute(
            "INSERT INTO jobs (id, avatar_id, owner, state, stage, options, audio_seconds, fps, total_frames, "
            "segments_total, create_time, trace_context) VALUES ('old', ?, '', 1, 'queued', ?, 2.0, 25.0, 50, 1, 1.0, '')",
            ("a" * 24, b""),
        )
        tx.execute(
            "INSERT INTO avatars (id, name, fps, frame_count, width, height, faces_found, create_time) "
            "VALUES (?, 'ann', 25.0, 1, 64, 64, 1, 1.0)",
            ("a" * 24,),
        )

    assert SCHEMA_VERSION == 11 and max(MIGRATIONS) == 11
    store._transaction(make_version_10)
    store.migrate()
    assert sql(store_url, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert store.get_job("old").model == "wav2lip"
    assert store.get_avatar("a" * 24, IMPLICIT_TENANT).model == "wav2lip"
    assert [x.id for x in store.list_avatars(tenant=IMPLICIT_TENANT, model="wav2lip")] == ["a" * 24]
    assert store.list_avatars(tenant=IMPLICIT_TENANT, model="musetalk") == []
    store.migrate()  # idempotent
