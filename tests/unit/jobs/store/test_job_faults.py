"""Job store faults of issue 17, on SQLite and a real PostgreSQL: poison rows, retries over time, outages.

Bad rows are planted with plain SQL, as a newer version, a hand edit or a partial restore would leave
them; the store must report them (DATA_LOSS naming the problem) or set them aside, never crash or
block the rest of the queue.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator

import grpc
import psycopg
import pytest

from services.jobs.store.jobs import JobFilter, JobState, JobStore, PageCursor, TaskKind, UnreadableRecord
from services.jobs.store.postgres import PostgresJobStore
from services.jobs.store.sqlite import sqlite_path
from services.serving.errors import CorruptRecord, NotFound, StoreUnavailable
from services.serving.tenants import IMPLICIT_TENANT
from tests.helpers.postgres import PostgresServer, missing_reason
from tests.unit.jobs.store.test_jobs import LONG_LEASE, avatar, new_job, sql

DATA_LOSS = grpc.StatusCode.DATA_LOSS.value[0]


def plant(url: str, statement: str) -> None:
    """Change rows with plain SQL, committed (what a hand edit or another version would leave)."""
    if url.startswith("sqlite:"):
        with contextlib.closing(sqlite3.connect(sqlite_path(url))) as conn, conn:
            conn.execute(statement)
        return
    with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
        conn.execute(statement)


# -- poison rows ---------------------------------------------------------------------------------------
def test_a_job_in_an_unknown_state_is_reported_not_crashed(job_store: JobStore, store_url: str) -> None:
    job_store.create_job(new_job("bad", segments=1))
    plant(store_url, "UPDATE jobs SET state = 99 WHERE id = 'bad'")
    with pytest.raises(CorruptRecord, match=r"job 'bad' .*state 99 is not one of .*QUEUED") as info:
        job_store.get_job("bad")
    assert info.value.code == grpc.StatusCode.DATA_LOSS


def test_a_job_with_a_field_that_is_not_json_is_reported(job_store: JobStore, store_url: str) -> None:
    job_store.create_job(new_job("bad", segments=1))
    plant(store_url, "UPDATE jobs SET models = '{not json' WHERE id = 'bad'")
    with pytest.raises(CorruptRecord, match=r"its models field is not JSON"):
        job_store.get_job("bad")


def test_a_damaged_row_is_listed_in_its_place_and_the_others_are_read(job_store: JobStore, store_url: str) -> None:
    """On main one damaged row made list_jobs raise: the tenant's whole ListJobs was DATA_LOSS."""
    for i, job_id in enumerate(("old", "bad", "new")):
        job_store.create_job(new_job(job_id, segments=1))
        plant(store_url, f"UPDATE jobs SET create_time = {1000 + i} WHERE id = '{job_id}'")
    plant(store_url, "UPDATE jobs SET labels = '{not json' WHERE id = 'bad'")
    listed = job_store.list_jobs(IMPLICIT_TENANT, JobFilter())
    assert [row.id for row in listed] == ["new", "bad", "old"]
    damaged = listed[1]
    assert isinstance(damaged, UnreadableRecord) and damaged.create_time == 1001.0
    assert "job 'bad'" in damaged.problem and "its labels field is not JSON" in damaged.problem
    assert [row.id for row in job_store.list_jobs(IMPLICIT_TENANT, JobFilter(), PageCursor(1001.0, "bad"))] == ["old"]

    job_store.put_avatar(avatar("a", t=1.0))
    job_store.put_avatar(avatar("b", t=2.0))
    plant(store_url, "UPDATE avatars SET labels = '[' WHERE id = 'a'")
    kept, broken = job_store.list_avatars()
    assert kept.id == "b" and isinstance(broken, UnreadableRecord) and broken.id == "a"
    assert "its labels field is not JSON" in broken.problem
    with pytest.raises(CorruptRecord, match="avatar 'a' has a record this lipline cannot read"):
        job_store.get_avatar("a")


def test_an_unknown_state_job_can_be_quarantined_and_the_queue_goes_on(job_store: JobStore, store_url: str) -> None:
    """On main, fail_job of a state-99 row raised ValueError (rolled back), and a claim that found its
    task out of attempts raised it too: every worker's loop ended. Now it is FAILED and the rest runs."""
    job_store.create_job(new_job("bad", segments=1))
    job_store.create_job(new_job("good", segments=1))
    plant(store_url, "UPDATE jobs SET state = 99 WHERE id = 'bad'")
    plant(store_url, "UPDATE tasks SET attempts = 3 WHERE job_id = 'bad'")  # out of attempts: the claim fails the job
    task = job_store.claim("w1", LONG_LEASE, max_attempts=3)
    assert task is not None and task.job_id == "good"
    bad = job_store.get_job("bad")
    assert bad.state == JobState.FAILED and "started 3 times" in bad.error
    assert not sql(store_url, "SELECT idx FROM tasks WHERE job_id = 'bad'")
    assert job_store.fail_job("bad", "again", DATA_LOSS) is False  # already terminal: nothing changes
    with pytest.raises(NotFound):
        job_store.fail_job("nosuch", "x", DATA_LOSS)


def test_tasks_of_a_deleted_job_are_never_claimed_and_can_be_purged(job_store: JobStore, store_url: str) -> None:
    job_store.create_job(new_job("gone", segments=2))
    job_store.create_job(new_job("kept", segments=1))
    plant(store_url, "DELETE FROM jobs WHERE id = 'gone'")
    assert job_store.purge_orphan_tasks() == 3  # two segments and the join
    assert job_store.purge_orphan_tasks() == 0
    assert {r[0] for r in sql(store_url, "SELECT DISTINCT job_id FROM tasks")} == {"kept"}
    assert job_store.queue_stats().waiting == 1


# -- retries over time ---------------------------------------------------------------------------------
def test_a_released_task_waits_out_its_delay_while_others_are_claimed(job_store: JobStore) -> None:
    job_store.create_job(new_job("j1", segments=2))
    first = job_store.claim("w1", LONG_LEASE, max_attempts=3)
    assert first is not None and (first.job_id, first.index, first.failures) == ("j1", 0, 0)
    job_store.release(first, count_attempt=False, retry_delay_s=1.5, error="the lipsync stage is UNAVAILABLE")
    other = job_store.claim("w1", LONG_LEASE, max_attempts=3)
    assert other is not None and other.index == 1  # not the delayed one
    assert job_store.claim("w1", LONG_LEASE, max_attempts=3) is None
    time.sleep(1.7)
    again = job_store.claim("w1", LONG_LEASE, max_attempts=3)
    assert again is not None and again.index == 0
    assert again.attempts == 1  # a retryable failure is not held against max_attempts
    assert again.failures == 1 and again.last_error == "the lipsync stage is UNAVAILABLE"
    assert 1.5 <= again.failing_for_s < 30
    assert again.ready_time >= first.lease_expires - LONG_LEASE + 1.5  # queue wait counts from not_before


def test_failures_accumulate_from_the_first_one(job_store: JobStore) -> None:
    job_store.create_job(new_job("j1", segments=1))
    task = job_store.claim("w1", LONG_LEASE, max_attempts=3)
    for n in range(1, 4):
        job_store.release(task, count_attempt=True, retry_delay_s=0, error=f"boom {n}")
        task = job_store.claim("w1", LONG_LEASE, max_attempts=10)
        assert task is not None and task.failures == n and task.last_error == f"boom {n}" and task.attempts == n + 1
    first_for = task.failing_for_s
    time.sleep(0.3)
    job_store.release(task, count_attempt=False)  # a graceful give-back records no failure
    task = job_store.claim("w1", LONG_LEASE, max_attempts=10)
    assert task.failures == 3 and task.failing_for_s >= first_for + 0.25 and task.attempts == 4


def test_release_of_the_join_with_a_delay(job_store: JobStore) -> None:
    job_store.create_job(new_job("j1", segments=0, frames=0))
    join = job_store.claim("w1", LONG_LEASE, max_attempts=3)
    assert join is not None and join.kind is TaskKind.JOIN
    job_store.release(join, retry_delay_s=60, error="blob store full")
    assert job_store.claim("w1", LONG_LEASE, max_attempts=3) is None


# -- PostgreSQL down -----------------------------------------------------------------------------------
@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own: it is stopped and started again, which the shared one must not be."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with PostgresServer() as server:
        yield server


def test_postgres_down_answers_unavailable_within_about_two_seconds_and_work_resumes(
    own_postgres: PostgresServer,
) -> None:
    """On main every call waited the pool's 10 s. Calls from several threads (a gateway's) during the
    outage each fail fast; after the restart the same store works again by itself."""
    store = PostgresJobStore(own_postgres.create_database("outage"))
    try:
        store.migrate()
        store.create_job(new_job("j1", segments=1))
        own_postgres.shut_down()
        times: list[float] = []
        errors: list[str] = []

        def call() -> None:
            start = time.monotonic()
            try:
                store.get_job("j1")
            except StoreUnavailable as exc:
                errors.append(str(exc))
            times.append(time.monotonic() - start)

        for _ in range(2):  # a first call finds the dead connection; later ones the pool's state
            threads = [threading.Thread(target=call) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
        assert len(errors) == 8, errors
        assert max(times) < 3.5, times  # "within about 2 s"; main waited the pool's 10 s
        assert "retry later" in errors[0] and f"127.0.0.1:{own_postgres.port}/outage" in errors[0]
        time.sleep(3)  # down for a while: the pool's reconnection back-off grows meanwhile
        own_postgres.start()
        deadline = time.monotonic() + 20
        while True:
            try:
                assert store.get_job("j1").state == JobState.QUEUED
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "the store did not resume after PostgreSQL came back"
                time.sleep(0.2)
        assert store.claim("w1", LONG_LEASE, 3) is not None
    finally:
        store.close()
