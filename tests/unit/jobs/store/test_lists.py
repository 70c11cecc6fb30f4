"""Lists and DeleteJob in the job store (issue 21 items 3 and 6): newest-first keyset pages that
stay whole while rows are inserted, ListJobs' filters (state, time, labels), per tenant; DeleteJob
of finished jobs only. Each test runs on SQLite and on a real PostgreSQL.
"""

from __future__ import annotations

import contextlib
import sqlite3

import psycopg
import pytest

from services.jobs.store.jobs import AvatarRecord, JobFilter, JobState, JobStore, NewJob, PageCursor
from services.jobs.store.sqlite import sqlite_path
from services.serving.errors import FailedPrecondition, NotFound
from tests.unit.jobs.store.test_jobs import sql

EVERY = JobFilter()


def job(job_id: str, tenant: str = "acme", labels: dict[str, str] | None = None) -> NewJob:
    return NewJob(
        job_id, "a" * 24, f"tenant:{tenant}", b"", 0.4, 25.0, 10, [(0, 10)], tenant=tenant, labels=labels or {}
    )


def change(url: str, statement: str) -> None:
    """Change rows directly (committed), as an operator's SQL would."""
    if url.startswith("sqlite:"):
        with contextlib.closing(sqlite3.connect(sqlite_path(url))) as conn, conn:
            conn.execute(statement)
        return
    with psycopg.connect(url, connect_timeout=5) as conn:
        conn.execute(statement)


def pages(store: JobStore, where: JobFilter, size: int, between=lambda: None) -> list[list[str]]:
    """Every page of acme's jobs, `between()` called after each (new jobs arrive meanwhile)."""
    out, after = [], None
    while True:
        rows = store.list_jobs("acme", where, after, size + 1)
        out.append([j.id for j in rows[:size]])
        between()
        if len(rows) <= size:
            return out
        after = PageCursor(rows[size - 1].create_time, rows[size - 1].id)


def test_paging_through_250_jobs_while_new_ones_arrive_sees_each_once(job_store: JobStore) -> None:
    for i in range(250):
        job_store.create_job(job(f"j{i:03d}"))
    arrived = iter(range(1000))
    seen = pages(job_store, EVERY, 100, lambda: [job_store.create_job(job(f"new{next(arrived)}")) for _ in range(7)])
    assert [len(p) for p in seen] == [100, 100, 50]
    flat = [j for p in seen for j in p]
    assert flat == [f"j{i:03d}" for i in reversed(range(250))]  # newest first, none twice, none missing


def test_rows_made_in_the_same_instant_page_by_id(job_store: JobStore, store_url: str) -> None:
    for i in range(5):
        job_store.create_job(job(f"j{i}"))
    change(store_url, "UPDATE jobs SET create_time = 1000.0")  # ties: the id decides, and no row is lost
    assert {j.create_time for j in job_store.list_jobs("acme", EVERY)} == {1000.0}
    assert pages(job_store, EVERY, 2) == [["j4", "j3"], ["j2", "j1"], ["j0"]]


def test_filters_by_state_time_and_labels(job_store: JobStore, store_url: str) -> None:
    job_store.create_job(job("a", labels={"order": "1", "user": "u1"}))
    job_store.create_job(job("b", labels={"order": "2", "user": "u1"}))
    job_store.create_job(job("c", labels={"order": "3"}))
    job_store.create_job(job("other", "bob", labels={"user": "u1"}))
    for i, job_id in enumerate(("a", "b", "c")):
        change(store_url, f"UPDATE jobs SET create_time = {100.0 + i} WHERE id = '{job_id}'")
    job_store.cancel_job("b", "acme")

    def ids(**where: object) -> list[str]:
        return [j.id for j in job_store.list_jobs("acme", JobFilter(**where))]  # type: ignore[arg-type]

    assert ids() == ["c", "b", "a"]
    assert ids(labels={"user": "u1"}) == ["b", "a"]  # bob's u1 job is not acme's
    assert ids(labels={"user": "u1", "order": "2"}) == ["b"]
    assert ids(labels={"user": "nobody"}) == []
    assert ids(states=frozenset({JobState.CANCELLED})) == ["b"]
    assert ids(states=frozenset({JobState.QUEUED, JobState.RUNNING})) == ["c", "a"]
    assert ids(created_after=101.0) == ["c", "b"]
    assert ids(created_before=101.0) == ["a"]
    assert ids(created_after=100.5, created_before=102.0, labels={"user": "u1"}) == ["b"]
    assert [j.id for j in job_store.list_jobs("bob", EVERY)] == ["other"]
    assert job_store.list_jobs("carol", EVERY) == []


def test_avatars_page_newest_first(job_store: JobStore) -> None:
    for i in range(5):
        job_store.put_avatar(
            AvatarRecord(f"{i:024x}", "n", 25.0, 1, 64, 64, 1, float(i), tenant="acme", labels={"i": str(i)})
        )
    first = job_store.list_avatars(2, "acme")
    assert [a.labels["i"] for a in first] == ["4", "3"]
    after = PageCursor(first[-1].create_time, first[-1].id)
    assert [a.labels["i"] for a in job_store.list_avatars(10, "acme", after)] == ["2", "1", "0"]
    assert job_store.list_avatars(10, "bob") == []


def test_delete_job_removes_a_finished_job_and_refuses_an_active_one(job_store: JobStore, store_url: str) -> None:
    job_store.create_job(job("j1", labels={"order": "1"}))
    with pytest.raises(FailedPrecondition, match="job j1 is QUEUED; cancel it first"):
        job_store.delete_job("j1", "acme")
    with pytest.raises(NotFound):
        job_store.delete_job("j1", "bob")  # another tenant's: as if it never existed
    job_store.cancel_job("j1", "acme")
    with pytest.raises(NotFound):
        job_store.delete_job("j1", "bob")
    assert job_store.delete_job("j1", "acme").state == JobState.CANCELLED
    with pytest.raises(NotFound):
        job_store.get_job("j1")
    assert sql(store_url, "SELECT count(*) FROM job_labels") == [(0,)]
    with pytest.raises(NotFound):
        job_store.delete_job("j1", "acme")
