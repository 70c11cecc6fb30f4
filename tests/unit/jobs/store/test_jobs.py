"""The job store contract (services/jobs/store/jobs.py), checked on SQLite and on a real PostgreSQL.

Every test gets `job_store` (migrated, empty) once per backend; `open_store` opens further stores on
the same database, as other gateway or worker processes would.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import psycopg
import pytest

from services.jobs.store.jobs import (
    AvatarRecord,
    JobState,
    JobStore,
    NewJob,
    Task,
    TaskKind,
)
from services.jobs.store.sql.schema import MIGRATIONS, SCHEMA_VERSION, schema
from services.jobs.store.sqlite import sqlite_path
from services.serving.errors import NotFound, StoreUnavailable, TooLarge
from tests.helpers.stores import race_processes

REPO_ROOT = Path(__file__).resolve().parents[4]
ABORTED = grpc.StatusCode.ABORTED.value[0]
CANCELLED = grpc.StatusCode.CANCELLED.value[0]
LONG_LEASE = 60.0


def new_job(job_id: str, segments: int = 3, owner: str = "alice", frames: int = 10, trace_context: str = "") -> NewJob:
    return NewJob(
        id=job_id,
        avatar_id="avatar-1",
        owner=owner,
        options=b"\x08\x01\x00\xff",  # any bytes, NUL included
        audio_seconds=segments * frames / 25.0,
        fps=25.0,
        total_frames=segments * frames,
        segments=[(i * frames, (i + 1) * frames) for i in range(segments)],
        stage_seconds={"upload": 0.25},
        trace_context=trace_context,
    )


def sql(url: str, query: str) -> list[tuple]:
    """Run SQL on the store's database directly (what a KEDA scaler or an operator would do)."""
    if url.startswith("sqlite:"):
        with contextlib.closing(sqlite3.connect(sqlite_path(url))) as conn:
            return conn.execute(query).fetchall()
    with psycopg.connect(url, connect_timeout=5) as conn:
        return conn.execute(query).fetchall()


def claim_all(store: JobStore, worker: str = "w") -> list[Task]:
    tasks = []
    while (task := store.claim(worker, LONG_LEASE, 3)) is not None:
        tasks.append(task)
    return tasks


def run_job_segments(store: JobStore, job_id: str) -> None:
    """Claim and complete every segment of the (only claimable) job."""
    while (task := store.claim("w", LONG_LEASE, 3)) is not None and not task.is_join:
        assert task.job_id == job_id
        assert store.complete_segment(task, task.end_frame - task.start_frame, {"lipsync": 1.0}, [])
    if task is not None:
        store.release(task, count_attempt=False)


# -- schema --------------------------------------------------------------------------------------------
def test_migrate_is_idempotent_and_records_the_version(job_store: JobStore, store_url: str) -> None:
    job_store.migrate()
    assert sql(store_url, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    job_store.create_job(new_job("j1", segments=4))
    # The KEDA PostgreSQL scaler's query, verbatim.
    assert sql(store_url, "SELECT count(*) FROM tasks WHERE state = 'waiting'") == [(4,)]


def test_concurrent_migrations_all_succeed(open_store: Callable[[], JobStore], store_url: str) -> None:
    stores = [open_store() for _ in range(4)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(stores))

    def migrate(store: JobStore) -> None:
        barrier.wait()
        try:
            store.migrate()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=migrate, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sql(store_url, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]


def test_a_version_1_database_is_migrated_and_keeps_its_jobs(
    open_store: Callable[[], JobStore], store_url: str
) -> None:
    store = open_store()

    def make_version_1(tx) -> None:  # what lipline 1 left behind
        for statement in schema(store.blob_type):
            tx.execute(statement)
        tx.execute("INSERT INTO schema_version (version) VALUES (1)")
        tx.execute(
            "INSERT INTO jobs (id, avatar_id, owner, state, stage, options, audio_seconds, fps, total_frames, "
            "segments_total, create_time) VALUES ('old', 'a', '', 1, 'queued', ?, 2.0, 25.0, 50, 1, 1.0)",
            (b"",),
        )

    store._transaction(make_version_1)
    store.migrate()
    assert sql(store_url, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    old = store.get_job("old")
    assert (old.total_frames, old.trace_context, old.output_sha256) == (
        50,
        "",
        "",
    )  # no checksum: DownloadOutput checks the size only
    store.create_job(new_job("new", segments=1, trace_context='{"traceparent": "00-ab-cd-01"}'))
    assert store.get_job("new").trace_context == '{"traceparent": "00-ab-cd-01"}'


def test_a_version_5_database_gets_task_kinds_and_segments_total_counts_segments_only(
    open_store: Callable[[], JobStore], store_url: str
) -> None:
    """Before version 6 a task's kind was its index (0 with an empty range: the audio task; -1: the
    join) and segments_total counted the audio task: a job caught mid-way keeps running after."""
    store = open_store()

    def make_version_5(tx) -> None:  # what lipline with schema 5 left behind
        for statement in schema(store.blob_type):
            tx.execute(statement)
        for version in range(2, 6):
            for statement in MIGRATIONS[version]:
                tx.execute(statement)
        tx.execute("INSERT INTO schema_version (version) VALUES (5)")
        for job_id, segments_done in (("mid", 2), ("fresh", 0)):  # "mid": its audio task and segment 1 are done
            tx.execute(
                "INSERT INTO jobs (id, avatar_id, owner, state, stage, options, audio_seconds, fps, total_frames, "
                "segments_total, segments_done, frames_done, create_time) VALUES (?, 'a', 'o', 2, 'render', ?, 0.8, 25.0, 20, 3, ?, ?, 1.0)",
                (job_id, b"", segments_done, 10 * (segments_done // 2)),
            )
            done = segments_done > 0
            first = "done" if done else "waiting"
            for idx, state, start, end in (
                (0, first, 0, 0),
                (1, first, 0, 10),
                (2, "waiting", 10, 20),
                (-1, "blocked", 0, 20),
            ):
                tx.execute(
                    "INSERT INTO tasks (job_id, idx, state, start_frame, end_frame) VALUES (?, ?, ?, ?, ?)",
                    (job_id, idx, state, start, end),
                )
        # a finished job (its tasks deleted) and one made without an audio task keep their counts
        tx.execute(
            "INSERT INTO jobs (id, avatar_id, owner, state, stage, options, audio_seconds, fps, total_frames, segments_total, segments_done, "
            "create_time) VALUES ('ended', 'a', 'o', 3, 'done', ?, 0.8, 25.0, 20, 3, 3, 1.0)",
            (b"",),
        )
        tx.execute(
            "INSERT INTO jobs (id, avatar_id, owner, state, stage, options, audio_seconds, fps, total_frames, segments_total, create_time) "
            "VALUES ('plain', 'a', 'o', 1, 'queued', ?, 0.4, 25.0, 10, 1, 2.0)",
            (b"",),
        )
        tx.execute(
            "INSERT INTO tasks (job_id, idx, state, start_frame, end_frame) VALUES ('plain', 0, 'waiting', 0, 10)"
        )
        tx.execute(
            "INSERT INTO tasks (job_id, idx, state, start_frame, end_frame) VALUES ('plain', -1, 'blocked', 0, 10)"
        )

    store._transaction(make_version_5)
    store.migrate()
    store.migrate()  # idempotent
    assert sql(store_url, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    kinds = sorted(sql(store_url, "SELECT job_id, idx, kind FROM tasks"))
    assert kinds == [
        ("fresh", -1, "join"),
        ("fresh", 0, "audio"),
        ("fresh", 1, "segment"),
        ("fresh", 2, "segment"),
        ("mid", -1, "join"),
        ("mid", 0, "audio"),
        ("mid", 1, "segment"),
        ("mid", 2, "segment"),
        ("plain", -1, "join"),
        ("plain", 0, "segment"),
    ]
    counts = {
        j: (store.get_job(j).segments_total, store.get_job(j).segments_done) for j in ("mid", "fresh", "ended", "plain")
    }
    assert counts == {"mid": (2, 1), "fresh": (2, 0), "ended": (3, 3), "plain": (1, 0)}
    # The job caught mid-way finishes: its last segment unblocks the join, which sees every segment.
    tasks = {t.job_id: t for t in claim_all(store) if t.job_id == "mid"}
    assert (tasks["mid"].index, tasks["mid"].kind) == (2, TaskKind.SEGMENT)
    assert store.complete_segment(tasks["mid"], 10, {}, [])
    join = next(t for t in claim_all(store) if t.job_id == "mid")
    assert join.kind is TaskKind.JOIN
    job = store.get_job("mid")
    assert (job.stage, job.segments_done, job.segments_total, job.frames_done) == ("join", 2, 2, 20)


def test_a_job_with_an_audio_task_counts_segments_only_and_joins_after_both(job_store: JobStore) -> None:
    job = dataclasses.replace(new_job("j1", segments=2), audio_task=True)
    created = job_store.create_job(job)
    assert (created.segments_total, created.segments_done) == (2, 0)
    tasks = claim_all(job_store)
    assert [(t.index, t.kind, t.start_frame, t.end_frame) for t in tasks] == [
        (0, TaskKind.AUDIO, 0, 0),
        (1, TaskKind.SEGMENT, 0, 10),
        (2, TaskKind.SEGMENT, 10, 20),
    ]
    audio, first, second = tasks
    for task in (first, second):
        assert job_store.complete_segment(task, 10, {"lipsync": 1.0}, [])
    after_segments = job_store.get_job("j1")
    assert (after_segments.segments_done, after_segments.frames_done, after_segments.stage) == (2, 20, "render")
    assert job_store.claim("w", LONG_LEASE, 3) is None  # the join waits for the audio track too
    assert job_store.complete_segment(audio, 0, {"aac": 0.5}, [])
    done = job_store.get_job("j1")
    assert (done.segments_done, done.segments_total, done.frames_done, done.stage) == (2, 2, 20, "join")
    assert done.stage_seconds == {"upload": 0.25, "lipsync": 2.0, "aac": 0.5}
    join = job_store.claim("w", LONG_LEASE, 3)
    assert join is not None and join.kind is TaskKind.JOIN and join.index == -1


def test_an_exhausted_audio_task_names_the_audio_track(job_store: JobStore) -> None:
    job_store.create_job(dataclasses.replace(new_job("a", segments=1), audio_task=True))
    for _ in range(2):
        audio = job_store.claim("w", LONG_LEASE, 2)
        assert audio is not None and audio.kind is TaskKind.AUDIO
        job_store.release(audio)
    assert job_store.claim("w", LONG_LEASE, 2) is None  # the audio task is out of attempts: its job fails
    failed = job_store.get_job("a")
    assert (
        failed.state == JobState.FAILED
        and "the audio track of job a was started 2 times and never finished" in failed.error
    )


# -- jobs ----------------------------------------------------------------------------------------------
def test_create_and_get_round_trip(job_store: JobStore) -> None:
    before = time.time()
    created = job_store.create_job(new_job("j1", segments=3))
    got = job_store.get_job("j1")
    assert got == created
    assert (got.state, got.stage, got.version) == (JobState.QUEUED, "queued", 1)
    assert got.options == b"\x08\x01\x00\xff"
    assert (got.total_frames, got.segments_total, got.segments_done, got.frames_done) == (30, 3, 0, 0)
    assert got.stage_seconds == {"upload": 0.25} and got.models == []
    assert before - 1 <= got.create_time <= time.time() + 1
    assert (got.start_time, got.finish_time, got.error, got.error_code) == (0.0, 0.0, "", 0)
    assert not got.terminal


def test_unknown_ids_raise_not_found_naming_the_id(job_store: JobStore) -> None:
    for call in (job_store.get_job, job_store.cancel_job, lambda i: job_store.fail_job(i, "x", 13)):
        with pytest.raises(NotFound, match="nope-123"):
            call("nope-123")
    with pytest.raises(NotFound, match="nope-123"):
        job_store.job_version("nope-123")


def test_active_limit_is_enforced_with_a_clear_message(job_store: JobStore) -> None:
    job_store.create_job(new_job("j1"), max_active=2)
    job_store.create_job(new_job("j2"), max_active=2)
    with pytest.raises(TooLarge, match=r"2 jobs queued or running \(limit 2\); retry later"):
        job_store.create_job(new_job("j3"), max_active=2)
    with pytest.raises(NotFound):
        job_store.get_job("j3")  # nothing of a rejected job remains
    job_store.cancel_job("j1")
    job_store.create_job(new_job("j3"), max_active=2)


def test_per_owner_limit(job_store: JobStore) -> None:
    job_store.create_job(new_job("a1", owner="alice"), max_active_per_owner=1)
    with pytest.raises(TooLarge, match=r"'alice' has 1 jobs queued or running \(limit 1 for one client\); retry later"):
        job_store.create_job(new_job("a2", owner="alice"), max_active_per_owner=1)
    job_store.create_job(new_job("b1", owner="bob"), max_active_per_owner=1)


def test_limit_holds_under_concurrent_creates(open_store: Callable[[], JobStore], job_store: JobStore) -> None:
    stores = [job_store] + [open_store() for _ in range(3)]
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def create(n: int) -> None:
        barrier.wait()
        try:
            stores[n % len(stores)].create_job(new_job(f"j{n}"), max_active=3)
            outcomes.append("ok")
        except TooLarge:
            outcomes.append("too many")

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counter(outcomes) == {"ok": 3, "too many": 5}
    assert job_store.queue_stats().active_jobs == 3


# -- claims --------------------------------------------------------------------------------------------
def test_claim_order_joins_first_then_jobs_in_turn_lowest_segment(job_store: JobStore) -> None:
    job_store.create_job(new_job("a", segments=2))
    job_store.create_job(new_job("b", segments=2))
    first = job_store.claim("w", LONG_LEASE, 3)
    second = job_store.claim("w", LONG_LEASE, 3)
    # Issue 17: jobs take turns (the job holding fewer live leases first), oldest job first on a tie.
    assert [(first.job_id, first.index), (second.job_id, second.index)] == [("a", 0), ("b", 0)]
    assert (first.start_frame, first.end_frame, first.attempts) == (0, 10, 1)
    assert job_store.complete_segment(first, 10, {}, [])
    third = job_store.claim("w", LONG_LEASE, 3)
    assert (third.job_id, third.index) == ("a", 1)
    assert job_store.complete_segment(third, 10, {}, [])
    # a's join is claimable now and goes before b's waiting segment.
    join = job_store.claim("w", LONG_LEASE, 3)
    assert (join.job_id, join.kind, join.is_join) == ("a", TaskKind.JOIN, True)
    assert (join.start_frame, join.end_frame) == (0, 20)
    assert [(t.job_id, t.index) for t in claim_all(job_store)] == [("b", 1)]


def claimed(store: JobStore, max_owner_share: float = 1.0) -> tuple[str, int | str]:
    """The claimed task's job and its segment index, or "join"."""
    task = store.claim("w", LONG_LEASE, 3, max_owner_share)
    assert task is not None
    return task.job_id, "join" if task.kind is TaskKind.JOIN else task.index


def test_a_short_job_submitted_after_a_long_one_gets_the_next_claim(job_store: JobStore) -> None:
    job_store.create_job(new_job("long", segments=50, owner="alice"))
    assert claimed(job_store) == ("long", 0)
    assert claimed(job_store) == ("long", 1)  # nobody else waits: the long job takes every worker
    job_store.create_job(new_job("short", segments=2, owner="bob"))
    # bob holds no worker, alice two: bob's job goes next, though alice's is older and has 48 waiting.
    assert claimed(job_store) == ("short", 0)
    # alice 2, bob 1: bob again (fewest leases per owner first), then alice when they are level.
    assert claimed(job_store) == ("short", 1)
    assert claimed(job_store) == ("long", 2)


def test_owners_take_turns_before_their_jobs_do(job_store: JobStore) -> None:
    job_store.create_job(new_job("a1", segments=3, owner="alice"))
    job_store.create_job(new_job("a2", segments=3, owner="alice"))
    job_store.create_job(new_job("b1", segments=3, owner="bob"))
    # alice's two jobs do not count as two turns: owners alternate, and within alice, her jobs.
    order = [claimed(job_store) for _ in range(6)]
    assert order == [("a1", 0), ("b1", 0), ("a2", 0), ("b1", 1), ("a1", 1), ("b1", 2)]


def test_expired_leases_do_not_count_as_held(job_store: JobStore) -> None:
    job_store.create_job(new_job("a", segments=3, owner="alice"))
    job_store.create_job(new_job("b", segments=3, owner="bob"))
    short = job_store.claim("w1", 0.3, 3)
    assert (short.job_id, short.index) == ("a", 0)
    assert claimed(job_store) == ("b", 0)
    time.sleep(0.5)  # alice's lease expires: she holds nothing, bob one; her expired task goes first
    assert claimed(job_store) == ("a", 0)


def test_an_owner_over_its_share_goes_after_others_even_with_a_join(job_store: JobStore) -> None:
    job_store.create_job(new_job("a", segments=1, owner="alice"))
    job_store.create_job(new_job("a2", segments=2, owner="alice"))
    job_store.create_job(new_job("b", segments=2, owner="bob"))
    a0 = job_store.claim("w", LONG_LEASE, 3)
    b0 = job_store.claim("w", LONG_LEASE, 3)
    assert [(a0.job_id, a0.index), (b0.job_id, b0.index)] == [("a", 0), ("b", 0)]
    assert claimed(job_store) == ("a2", 0)
    assert job_store.complete_segment(a0, 10, {}, [])  # a's join is WAITING now
    assert job_store.complete_segment(b0, 10, {}, [])  # bob holds no lease, b's segment 1 waits
    # Share off: joins first. alice holds 1 of 1 live leases.
    join = job_store.claim("w", LONG_LEASE, 3)
    assert (join.job_id, join.kind) == ("a", TaskKind.JOIN)
    job_store.release(join, count_attempt=False)
    # Share 0.5: alice would hold 2 of 2 (over), bob 1 of 2 (within): bob's segment goes first.
    assert claimed(job_store, 0.5) == ("b", 1)
    # Everyone over their share: the claim still hands out work (it never leaves a worker idle).
    assert claimed(job_store, 0.5) == ("a", "join")
    assert claimed(job_store, 0.5) == ("a2", 1)
    assert job_store.claim("w", LONG_LEASE, 3, 0.5) is None


def test_first_claim_makes_the_job_running(job_store: JobStore) -> None:
    job_store.create_job(new_job("j1"))
    task = job_store.claim("w", LONG_LEASE, 3)
    job = job_store.get_job("j1")
    assert (job.state, job.stage, job.version) == (JobState.RUNNING, "render", 2)
    assert abs(job.start_time - task.lease_expires + LONG_LEASE) < 0.5
    job_store.claim("w", LONG_LEASE, 3)
    assert job_store.get_job("j1").version == 2  # later claims change the tasks, not the job


def test_claim_on_an_empty_queue_returns_none(job_store: JobStore) -> None:
    assert job_store.claim("w", LONG_LEASE, 3) is None


def test_lease_expiry_makes_a_task_claimable_and_voids_the_old_token(job_store: JobStore) -> None:
    job_store.create_job(new_job("j1", segments=1))
    old = job_store.claim("w1", 0.3, 3)
    assert job_store.job_tasks_active("j1")
    assert job_store.claim("w2", 0.3, 3) is None  # the join is still blocked
    time.sleep(0.4)
    assert not job_store.job_tasks_active("j1")
    assert job_store.queue_stats().waiting == 1
    new = job_store.claim("w2", LONG_LEASE, 3)
    assert (new.job_id, new.index, new.attempts) == ("j1", 0, 2)
    assert new.token != old.token
    assert new.ready_time == pytest.approx(old.lease_expires)  # claimable since the lease expired
    assert not job_store.renew(old, LONG_LEASE)
    assert not job_store.complete_segment(old, 10, {}, [])
    job_store.release(old)  # no effect: not its lease any more
    assert job_store.job_tasks_active("j1")
    assert job_store.complete_segment(new, 10, {}, [])


def test_renew_extends_the_lease(job_store: JobStore) -> None:
    job_store.create_job(new_job("j1", segments=1))
    task = job_store.claim("w1", 0.3, 3)
    time.sleep(0.15)
    assert job_store.renew(task, 1.0)
    time.sleep(0.3)  # past the first lease's end
    assert job_store.claim("w2", 0.3, 3) is None
    assert job_store.job_tasks_active("j1")


def test_a_task_out_of_attempts_fails_its_job_and_the_claim_goes_on(job_store: JobStore) -> None:
    job_store.create_job(new_job("a", segments=2))
    job_store.create_job(new_job("b", segments=1))
    for attempt in (1, 2):
        task = job_store.claim("w", LONG_LEASE, max_attempts=2)
        assert (task.job_id, task.index, task.attempts) == ("a", 0, attempt)
        job_store.release(task)  # a retryable failure: the attempt counts
    task = job_store.claim("w", LONG_LEASE, max_attempts=2)
    assert (task.job_id, task.index) == ("b", 0)
    a = job_store.get_job("a")
    assert (a.state, a.stage, a.error_code) == (JobState.FAILED, "failed", ABORTED)
    assert "segment 0 of job a was started 2 times and never finished" in a.error
    assert a.finish_time > 0
    assert sql_count(job_store, "a") == 0


def sql_count(store: JobStore, job_id: str) -> int:
    return sql(store.url, f"SELECT count(*) FROM tasks WHERE job_id = '{job_id}'")[0][0]


def test_release_without_counting_the_attempt(job_store: JobStore) -> None:
    job_store.create_job(new_job("j1", segments=1))
    task = job_store.claim("w", LONG_LEASE, 3)
    job_store.release(task, count_attempt=False)  # graceful shutdown
    again = job_store.claim("w", LONG_LEASE, 3)
    assert again.attempts == 1
    assert again.ready_time >= task.ready_time
    job_store.release(again)  # counted
    assert job_store.claim("w", LONG_LEASE, 3).attempts == 2
    assert not job_store.renew(again, 1.0)


# -- completion ----------------------------------------------------------------------------------------
def test_complete_segments_then_join(job_store: JobStore, store_url: str) -> None:
    job_store.create_job(new_job("j1", segments=2))
    s0, s1 = job_store.claim("w", LONG_LEASE, 3), job_store.claim("w", LONG_LEASE, 3)
    models = [{"name": "wav2lip", "backend": "torch", "precision": "fp16"}]
    assert job_store.complete_segment(s1, 10, {"lipsync": 1.5, "encode": 0.5}, models)
    job = job_store.get_job("j1")
    assert (job.frames_done, job.segments_done, job.stage, job.version) == (10, 1, "render", 3)
    assert job.stage_seconds == {"upload": 0.25, "lipsync": 1.5, "encode": 0.5}
    assert job.models == models
    assert job_store.claim("w", LONG_LEASE, 3) is None  # the join waits for s0
    assert not job_store.complete_segment(s1, 10, {}, [])  # done already: no longer leased

    before = time.time()
    assert job_store.complete_segment(s0, 10, {"lipsync": 2.0}, [{"name": "other"}])
    job = job_store.get_job("j1")
    assert (job.frames_done, job.segments_done, job.stage, job.version) == (20, 2, "join", 4)
    assert job.stage_seconds == {"upload": 0.25, "lipsync": 3.5, "encode": 0.5}
    assert job.models == models  # set once
    assert job_store.queue_stats().waiting == 1
    join = job_store.claim("w", LONG_LEASE, 3)
    assert join.is_join and join.ready_time >= before - 1
    with pytest.raises(ValueError):
        job_store.complete_segment(join, 0, {}, [])

    assert job_store.complete_join(join, "outputs/j1.mp4", 12345, {"join": 0.75}, "ab" * 32)
    job = job_store.get_job("j1")
    assert (job.state, job.stage) == (JobState.SUCCEEDED, "done")
    assert (job.output_key, job.output_bytes, job.output_sha256) == ("outputs/j1.mp4", 12345, "ab" * 32)
    assert job.stage_seconds["join"] == 0.75 and job.finish_time >= job.start_time > 0
    assert (job.error, job.error_code, job.version) == ("", 0, 5)
    assert sql(store_url, "SELECT count(*) FROM tasks") == [(0,)]
    assert not job_store.complete_join(join, "x", 1, {})
    assert job_store.queue_stats().active_jobs == 0


# -- cancel and fail -----------------------------------------------------------------------------------
def test_cancel_deletes_tasks_and_voids_leases(job_store: JobStore, store_url: str) -> None:
    job_store.create_job(new_job("j1", segments=2))
    task = job_store.claim("w", LONG_LEASE, 3)
    job = job_store.cancel_job("j1")
    assert (job.state, job.stage, job.error_code, job.version) == (JobState.CANCELLED, "cancelled", CANCELLED, 3)
    assert job.finish_time > 0 and job.terminal
    assert sql(store_url, "SELECT count(*) FROM tasks") == [(0,)]
    assert not job_store.renew(task, LONG_LEASE)
    assert not job_store.complete_segment(task, 10, {}, [])
    assert not job_store.job_tasks_active("j1")
    assert job_store.claim("w", LONG_LEASE, 3) is None
    assert job_store.cancel_job("j1") == job  # terminal: unchanged
    assert not job_store.fail_job("j1", "late", 13)


def test_fail_job(job_store: JobStore) -> None:
    job_store.create_job(new_job("j1", segments=2))
    task = job_store.claim("w", LONG_LEASE, 3)
    assert job_store.fail_job("j1", "the avatar's blob is gone", 9)
    job = job_store.get_job("j1")
    assert (job.state, job.stage, job.error_code) == (JobState.FAILED, "failed", 9)
    assert job.error == "the avatar's blob is gone"
    assert not job_store.renew(task, 1.0)
    assert not job_store.fail_job("j1", "again", 13)
    assert job_store.get_job("j1").version == job.version
    assert job_store.cancel_job("j1").state == JobState.FAILED


def test_queue_stats(job_store: JobStore) -> None:
    assert job_store.queue_stats().waiting == 0
    job_store.create_job(new_job("a", segments=3))
    job_store.create_job(new_job("b", segments=1))
    time.sleep(0.05)
    job_store.claim("w", LONG_LEASE, 3)
    job_store.claim("w", 0.3, 3)
    stats = job_store.queue_stats()
    assert (stats.waiting, stats.leased, stats.active_jobs) == (2, 2, 2)
    assert 0.05 <= stats.oldest_wait_s < 5
    time.sleep(0.35)  # the short lease expires: claimable again
    stats = job_store.queue_stats()
    assert (stats.waiting, stats.leased) == (3, 1)


# -- avatars -------------------------------------------------------------------------------------------
def avatar(avatar_id: str, name: str = "Ann", t: float = 1.0) -> AvatarRecord:
    return AvatarRecord(
        id=avatar_id, name=name, fps=25.0, frame_count=100, width=640, height=480, faces_found=98, create_time=t
    )


def test_avatars(job_store: JobStore) -> None:
    job_store.put_avatar(avatar("b", t=2.0))
    job_store.put_avatar(avatar("a", t=1.0))
    job_store.put_avatar(avatar("c", t=3.0))
    job_store.put_avatar(avatar("a", name="other", t=9.0))  # same content hash: left as it is
    assert job_store.get_avatar("a") == avatar("a", t=1.0)
    assert [a.id for a in job_store.list_avatars()] == ["c", "b", "a"]  # newest first
    assert [a.id for a in job_store.list_avatars(limit=2)] == ["c", "b"]
    job_store.delete_avatar("b")
    with pytest.raises(NotFound, match="'b'"):
        job_store.get_avatar("b")
    with pytest.raises(NotFound, match="'b'"):
        job_store.delete_avatar("b")
    assert [a.id for a in job_store.list_avatars()] == ["c", "a"]


def test_known_avatars_and_job_versions_name_the_ids_that_have_rows(job_store: JobStore) -> None:
    """What the janitor asks before it deletes files no row refers to: a deleted avatar still has its
    row (its files go with it, by the avatar janitor), so it is known; an id never recorded is not."""
    job_store.put_avatar(avatar("a"))
    job_store.put_avatar(dataclasses.replace(avatar("b"), tenant="other"))
    job_store.put_avatar(avatar("c"))
    job_store.delete_avatar("c")
    job_store.create_job(new_job("j1"))
    many = [f"x{i}" for i in range(1200)]  # more than one query's worth of ids
    assert job_store.known_avatars(["a", "b", "c", "never", *many]) == {"a", "b", "c"}
    assert job_store.known_avatars([]) == set()
    assert set(job_store.job_versions(["j1", "never", *many])) == {"j1"}


# -- concurrency ---------------------------------------------------------------------------------------
def test_four_threads_claim_each_segment_exactly_once(job_store: JobStore) -> None:
    for j in range(4):
        job_store.create_job(new_job(f"j{j}", segments=10))
    claimed: list[tuple[str, int]] = []
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        barrier.wait()
        try:
            while (task := job_store.claim(name, LONG_LEASE, 3)) is not None:
                claimed.append((task.job_id, task.kind.value if task.is_join else task.index))
                if task.is_join:
                    assert job_store.complete_join(task, f"out/{task.job_id}", 1, {})
                else:
                    assert job_store.complete_segment(task, 10, {"lipsync": 0.1}, [])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    segments = sorted(c for c in claimed if c[1] != "join")
    assert segments == sorted((f"j{j}", i) for j in range(4) for i in range(10))
    assert sorted(c for c in claimed if c[1] == "join") == [(f"j{j}", "join") for j in range(4)]
    for j in range(4):
        job = job_store.get_job(f"j{j}")
        assert (job.state, job.frames_done, job.segments_done) == (JobState.SUCCEEDED, 100, 10)
        assert job.stage_seconds["lipsync"] == pytest.approx(1.0)


_CLAIMER = """
import json, sys
from services.jobs.store import open_job_store
store = open_job_store(sys.argv[1])
sys.stdin.readline()  # start together
got = []
while (task := store.claim(sys.argv[2], 60, 3)) is not None:
    got.append([task.job_id, task.index])
store.close()
print(json.dumps(got))
"""


def test_two_processes_claim_each_segment_exactly_once(job_store: JobStore, store_url: str) -> None:
    for j in range(4):
        job_store.create_job(new_job(f"j{j}", segments=10))
    claimed = []
    for code, out, err in race_processes(_CLAIMER, [[store_url, f"p{i}"] for i in range(2)]):
        assert code == 0, err
        claimed += [tuple(c) for c in json.loads(out)]
    assert sorted(claimed) == sorted((f"j{j}", i) for j in range(4) for i in range(10))


# -- PostgreSQL outages --------------------------------------------------------------------------------
def test_postgres_unreachable_raises_store_unavailable_quickly(refused_port: int) -> None:
    from services.jobs.store.postgres import PostgresJobStore

    port = refused_port  # bound, never listening: nobody else can take it during the test
    store = PostgresJobStore(f"postgresql://lipline:secret@127.0.0.1:{port}/nowhere", pool_timeout_s=1.0)
    try:
        start = time.monotonic()
        with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}/nowhere") as info:
            store.get_job("j1")
        assert time.monotonic() - start < 5
        assert "secret" not in str(info.value)
    finally:
        store.close()


def test_postgres_restart_is_survived(postgres_server) -> None:
    from services.jobs.store.postgres import PostgresJobStore

    store = PostgresJobStore(postgres_server.create_database("restart_store"))
    try:
        store.migrate()
        store.create_job(new_job("j1"))
        barrier = threading.Barrier(4)

        def use() -> None:
            barrier.wait()
            for _ in range(10):
                store.queue_stats()

        threads = [threading.Thread(target=use) for _ in range(4)]  # several pooled connections, all to die
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        postgres_server.restart()
        start = time.monotonic()
        with contextlib.suppress(StoreUnavailable):
            store.get_job("j1")  # works (a dead pooled connection is replaced) or says so
        assert time.monotonic() - start < 15
        while True:
            try:
                task = store.claim("w", LONG_LEASE, 3)
                break
            except StoreUnavailable:
                assert time.monotonic() - start < 15, "the store did not recover after the restart"
                time.sleep(0.2)
        assert (task.job_id, task.index) == ("j1", 0)
    finally:
        store.close()


# -- change feeds --------------------------------------------------------------------------------------
def change_later(store: JobStore, job_id: str, delay: float) -> threading.Thread:
    """Change the job from another thread (and connection) after `delay` seconds."""

    def change() -> None:
        time.sleep(delay)
        task = store.claim("w", LONG_LEASE, 3)
        assert task is not None and task.job_id == job_id

    thread = threading.Thread(target=change)
    thread.start()
    return thread


def test_feed_wait_returns_at_once_when_the_version_is_already_higher(job_store: JobStore) -> None:
    job_store.create_job(new_job("j1"))

    async def main() -> float:
        feed = job_store.change_feed()
        await feed.start()
        try:
            start = time.monotonic()
            await feed.wait("j1", 0, timeout=10)
            return time.monotonic() - start
        finally:
            await feed.close()

    assert asyncio.run(main()) < 1


def test_feed_wait_times_out_without_a_change(job_store: JobStore) -> None:
    job = job_store.create_job(new_job("j1"))

    async def main() -> float:
        feed = job_store.change_feed()
        await feed.start()
        try:
            start = time.monotonic()
            await feed.wait("j1", job.version, timeout=0.3)
            return time.monotonic() - start
        finally:
            await feed.close()

    assert 0.25 <= asyncio.run(main()) < 2


def test_feed_wakes_many_waiters_promptly_on_a_change(job_store: JobStore, open_store) -> None:
    job = job_store.create_job(new_job("j1"))
    other = job_store.create_job(new_job("j2"))
    writer = open_store()  # another connection, as another process would be

    async def main() -> tuple[float, list[bool], int]:
        feed = job_store.change_feed()
        await feed.start()
        try:
            start = time.monotonic()
            loop = asyncio.get_running_loop()
            before = threading.active_count()  # what the process (earlier tests' pools included) already runs
            waiters = [asyncio.create_task(feed.wait("j1", job.version, timeout=10)) for _ in range(100)]
            unrelated = asyncio.create_task(feed.wait("j2", other.version, timeout=10))
            await asyncio.sleep(0.3)
            threads = threading.active_count() - before
            thread = await loop.run_in_executor(None, change_later, writer, "j1", 0.0)
            await asyncio.gather(*waiters)
            elapsed = time.monotonic() - start
            await loop.run_in_executor(None, thread.join)
            done = [unrelated.done()]
            unrelated.cancel()
            return elapsed, done, threads
        finally:
            await feed.close()

    elapsed, unrelated_done, threads = asyncio.run(main())
    assert elapsed < 3
    assert unrelated_done == [False]  # another job's change wakes only its own waiters
    assert threads < 10  # 101 parked waiters hold no threads


def test_feed_close_wakes_waiters(job_store: JobStore) -> None:
    job = job_store.create_job(new_job("j1"))

    async def main() -> float:
        feed = job_store.change_feed()
        await feed.start()
        waiter = asyncio.create_task(feed.wait("j1", job.version, timeout=10))
        await asyncio.sleep(0.2)
        start = time.monotonic()
        await feed.close()
        await waiter
        return time.monotonic() - start

    assert asyncio.run(main()) < 1


def test_feed_unknown_job_raises_not_found(job_store: JobStore) -> None:
    async def main() -> None:
        feed = job_store.change_feed()
        await feed.start()
        try:
            await feed.wait("nope", 0, timeout=1)
        finally:
            await feed.close()

    with pytest.raises(NotFound, match="nope"):
        asyncio.run(main())


def test_postgres_feed_survives_a_server_restart(postgres_server) -> None:
    from services.jobs.store.postgres import PostgresJobStore

    url = postgres_server.create_database("restart_feed")
    store, writer = PostgresJobStore(url), PostgresJobStore(url)
    try:
        store.migrate()
        job = store.create_job(new_job("j1"))

        async def main() -> float:
            feed = store.change_feed()
            await feed.start()
            try:
                assert await feed.wait_connected(5)
                await asyncio.to_thread(postgres_server.restart)
                deadline = time.monotonic() + 10
                while feed.connections < 2:  # noticed the loss and listens again
                    assert time.monotonic() < deadline, "the feed did not reconnect"
                    await asyncio.sleep(0.05)
                waiter = asyncio.create_task(feed.wait("j1", job.version, timeout=10))
                await asyncio.sleep(0.3)
                assert not waiter.done()
                start = time.monotonic()
                thread = await asyncio.to_thread(change_later, writer, "j1", 0.0)
                await waiter
                await asyncio.to_thread(thread.join)
                return time.monotonic() - start
            finally:
                await feed.close()

        assert asyncio.run(main()) < 2
    finally:
        store.close()
        writer.close()
