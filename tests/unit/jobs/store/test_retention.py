"""Retention in the job store (issue 21 item 6): the output's expiry stamped at the join, the rows the
janitor sweeps and their marks, the named lease of one janitor at a time, and schema 9's migration
from 8. Each test runs on SQLite and on a real PostgreSQL.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from services.jobs.store.jobs import JobState, JobStore
from services.jobs.store.sql.schema import SCHEMA_VERSION, migration, schema
from tests.unit.jobs.store.test_jobs import LONG_LEASE, new_job, run_job_segments, sql

DAY = 86400.0


def succeed(store: JobStore, job_id: str, ttl_s: float = 0.0) -> None:
    """Create the job and run it to SUCCEEDED, its join stamping `ttl_s`."""
    store.create_job(new_job(job_id, segments=1))
    run_job_segments(store, job_id)
    join = store.claim("w", LONG_LEASE, 3)
    assert join is not None and join.is_join
    assert store.complete_join(join, f"outputs/{job_id}.mp4", 10, {}, "ab" * 32, ttl_s)


def test_the_join_stamps_the_outputs_expiry_on_the_stores_clock(job_store: JobStore) -> None:
    succeed(job_store, "kept", ttl_s=DAY)
    job = job_store.get_job("kept")
    assert job.state is JobState.SUCCEEDED
    assert abs(job.output_expire_time - (job.finish_time + DAY)) < 1.0 and job.output_purge_time == 0
    assert job_store.expired_outputs() == []  # a day to go


def test_expired_outputs_are_listed_until_marked_and_the_mark_bumps_the_version(job_store: JobStore) -> None:
    succeed(job_store, "old", ttl_s=1e-6)  # expired as soon as it is written
    succeed(job_store, "new", ttl_s=DAY)
    assert job_store.expired_outputs() == [("old", "outputs/old.mp4")]
    before = job_store.get_job("old").version
    assert job_store.mark_output_purged("old") is True
    assert job_store.mark_output_purged("old") is False  # once
    after = job_store.get_job("old")
    assert after.output_purge_time > 0 and after.version == before + 1 and after.state is JobState.SUCCEEDED
    assert job_store.expired_outputs() == []


def test_a_job_without_an_expiry_is_stamped_from_its_finish_time(job_store: JobStore) -> None:
    succeed(job_store, "unstamped")  # ttl 0: the join leaves it to the janitor
    job_store.create_job(new_job("queued"))
    assert job_store.get_job("unstamped").output_expire_time == 0
    assert job_store.stamp_output_expiry(100.0) == 1  # the queued job has no output
    job = job_store.get_job("unstamped")
    assert job.output_expire_time == job.finish_time + 100.0
    assert job_store.stamp_output_expiry(100.0) == 0


def test_ended_jobs_files_are_listed_once_past_the_grace(job_store: JobStore) -> None:
    succeed(job_store, "done")
    job_store.create_job(new_job("failed"))
    assert job_store.fail_job("failed", "boom", 13)
    job_store.create_job(new_job("running"))
    assert job_store.unpurged_job_files(older_than_s=DAY) == []  # both ended just now
    assert sorted(job_store.unpurged_job_files(older_than_s=0)) == ["done", "failed"]
    assert job_store.mark_files_purged(["done", "failed"]) == 2
    assert job_store.unpurged_job_files(older_than_s=0) == []
    assert job_store.mark_files_purged(["done"]) == 0


def test_one_holder_at_a_time_renewed_by_its_holder_and_taken_once_expired(job_store: JobStore) -> None:
    assert job_store.lease_holder("janitor") == ""
    assert job_store.take_lease("janitor", "a", 60.0)
    assert not job_store.take_lease("janitor", "b", 60.0)
    assert job_store.take_lease("janitor", "a", 0.0)  # the holder renews (here: to expire at once)
    assert job_store.lease_holder("janitor") == ""  # expired
    assert job_store.take_lease("janitor", "b", 60.0)
    assert job_store.lease_holder("janitor") == "b"
    assert not job_store.take_lease("janitor", "a", 60.0)
    job_store.drop_lease("janitor", "a")  # not a's: nothing changes
    assert job_store.lease_holder("janitor") == "b"
    job_store.drop_lease("janitor", "b")
    assert job_store.take_lease("janitor", "a", 60.0)
    assert job_store.take_lease("other", "b", 60.0)  # leases are per name


def test_of_racing_takers_on_their_own_connections_exactly_one_gets_the_lease(
    open_store: Callable[[], JobStore], job_store: JobStore
) -> None:
    stores = [open_store() for _ in range(8)]
    start = threading.Barrier(len(stores))
    got: list[str] = []

    def take(i: int) -> None:
        start.wait()
        if stores[i].take_lease("janitor", f"w{i}", 60.0):
            got.append(f"w{i}")

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 1 and job_store.lease_holder("janitor") == got[0]


def test_a_version_8_database_gets_expiry_columns_and_leases(
    open_store: Callable[[], JobStore], store_url: str
) -> None:
    store = open_store()

    def make_version_8(tx) -> None:  # type: ignore[no-untyped-def]  # what lipline with schema 8 left behind
        for statement in schema(store.blob_type):  # type: ignore[attr-defined]
            tx.execute(statement)
        for version in range(2, 9):
            for statement in migration(version, store.blob_type):  # type: ignore[attr-defined]
                tx.execute(statement)
        tx.execute("INSERT INTO schema_version (version) VALUES (8)")
        tx.execute(
            "INSERT INTO jobs (id, avatar_id, owner, state, stage, options, audio_seconds, fps, total_frames, "
            "segments_total, create_time, finish_time, output_key, tenant) "
            "VALUES ('old', 'a', 'o', 3, 'done', ?, 0.4, 25.0, 10, 1, 1.0, 2.0, 'outputs/old.mp4', 'acme')",
            (b"",),
        )

    store._transaction(make_version_8)  # type: ignore[attr-defined]
    store.migrate()
    store.migrate()  # idempotent
    assert sql(store_url, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    old = store.get_job("old")
    assert (old.output_expire_time, old.output_purge_time) == (0.0, 0.0)
    assert store.stamp_output_expiry(10.0) == 1
    assert store.expired_outputs() == [("old", "outputs/old.mp4")]  # finished at t=2, expired at t=12
    assert store.unpurged_job_files(older_than_s=0) == ["old"]
    assert store.take_lease("janitor", "a", 60.0)
