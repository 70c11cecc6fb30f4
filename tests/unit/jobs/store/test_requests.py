"""Request ids of idempotent creates in the job store (issue 21 item 1): a repeat within the window
returns the first one's job or avatar, another request with the same id is refused, ids are per
tenant, and concurrent duplicates (threads and processes on their own connections) make one job.
Schema 8's migration from 7 keeps old rows. Each test runs on SQLite and on a real PostgreSQL.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest

from services.jobs.store.jobs import AvatarRecord, JobState, JobStore, NewJob, RequestKey, RequestKind
from services.jobs.store.sql.schema import SCHEMA_VERSION, migration, schema
from services.serving.errors import InvalidRequest, NotFound
from tests.helpers.stores import race_processes
from tests.unit.jobs.store.test_jobs import sql

DAY = 86400.0
RID = "5b0c3d52-8a3e-4b1f-9a37-0c6f2b7d9e11"


def job(job_id: str, tenant: str = "acme", labels: dict[str, str] | None = None) -> NewJob:
    return NewJob(
        job_id, "a" * 24, f"tenant:{tenant}", b"", 0.4, 25.0, 10, [(0, 10)], tenant=tenant, labels=labels or {}
    )


def key(digest: str = "d1", window_s: float = DAY, request_id: str = RID) -> RequestKey:
    return RequestKey(request_id, digest, window_s)


def test_a_repeat_returns_the_first_job_and_inserts_nothing(job_store: JobStore, store_url: str) -> None:
    first = job_store.create_job(job("j1", labels={"order": "42"}), request=key())
    again = job_store.create_job(job("j2"), request=key())
    assert (first.id, again.id, again.labels) == ("j1", "j1", {"order": "42"})
    assert sql(store_url, "SELECT id FROM jobs") == [("j1",)]
    assert sql(store_url, "SELECT count(*) FROM tasks WHERE job_id = 'j2'") == [(0,)]
    found = job_store.find_request("acme", RequestKind.JOB, RID, DAY)
    assert found is not None and (found.target_id, found.digest) == ("j1", "d1")


def test_the_same_id_with_another_request_is_refused_saying_so(job_store: JobStore) -> None:
    job_store.create_job(job("j1"), request=key("d1"))
    with pytest.raises(InvalidRequest, match=f"request_id {RID} was already used for a different job request"):
        job_store.create_job(job("j2"), request=key("d2"))
    with pytest.raises(NotFound):
        job_store.get_job("j2")


def test_request_ids_are_per_tenant_and_per_kind(job_store: JobStore) -> None:
    assert job_store.create_job(job("j1", "acme"), request=key()).id == "j1"
    assert job_store.create_job(job("j2", "bob"), request=key("other")).id == "j2"  # bob's own id
    assert job_store.find_request("carol", RequestKind.JOB, RID, DAY) is None
    avatar = AvatarRecord("b" * 24, "n", 25.0, 1, 64, 64, 1, 1.0, tenant="acme", content_hash="c" * 24)
    assert job_store.put_avatar(avatar, key("avatar-digest")).id == "b" * 24  # an avatar's ids are apart


def test_after_the_window_the_id_makes_a_new_job(job_store: JobStore) -> None:
    job_store.create_job(job("j1"), request=key())
    # Any time at all has passed since j1: a window of a microsecond is over.
    assert job_store.find_request("acme", RequestKind.JOB, RID, 1e-6) is None
    assert job_store.create_job(job("j2"), request=key("d2", window_s=1e-6)).id == "j2"
    assert job_store.create_job(job("j3"), request=key("d2")).id == "j2"  # the id now names j2
    assert job_store.purge_requests(DAY) == 0
    assert job_store.purge_requests(1e-6) == 1
    assert job_store.find_request("acme", RequestKind.JOB, RID, DAY) is None


def test_a_refused_create_records_no_request_id(job_store: JobStore) -> None:
    with pytest.raises(NotFound, match="avatar"):  # its avatar does not exist
        job_store.create_job(job("j1"), check_avatar=True, request=key())
    assert job_store.find_request("acme", RequestKind.JOB, RID, DAY) is None


def test_deleting_the_job_or_avatar_forgets_its_request_ids(job_store: JobStore) -> None:
    job_store.create_job(job("j1"), request=key())
    job_store.cancel_job("j1", "acme")
    job_store.delete_job("j1", "acme")
    assert job_store.create_job(job("j2"), request=key()).id == "j2"
    avatar = AvatarRecord("b" * 24, "n", 25.0, 1, 64, 64, 1, 1.0, tenant="acme", content_hash="c" * 24)
    assert job_store.put_avatar(avatar, key("a1")).id == "b" * 24
    job_store.delete_avatar("b" * 24, "acme")
    assert job_store.find_request("acme", RequestKind.AVATAR, RID, DAY) is None


def test_an_avatar_request_for_known_bytes_names_the_known_avatar(job_store: JobStore) -> None:
    """A request id sent with bytes the tenant already uploaded (another id) records that avatar."""
    known = AvatarRecord("b" * 24, "n", 25.0, 1, 64, 64, 1, 1.0, tenant="acme", content_hash="c" * 24)
    job_store.put_avatar(known)
    copy = AvatarRecord("e" * 24, "n", 25.0, 1, 64, 64, 1, 2.0, tenant="acme", content_hash="c" * 24)
    assert job_store.put_avatar(copy, key("a1")).id == "b" * 24
    found = job_store.find_request("acme", RequestKind.AVATAR, RID, DAY)
    assert found is not None and found.target_id == "b" * 24
    other = AvatarRecord("f" * 24, "n", 25.0, 1, 64, 64, 1, 3.0, tenant="acme", content_hash="9" * 24)
    assert job_store.put_avatar(other, key("a1")).id == "b" * 24  # a repeat: nothing new inserted
    with pytest.raises(NotFound):
        job_store.get_avatar("f" * 24)


def test_eight_threads_racing_one_request_id_make_one_job(
    open_store: Callable[[], JobStore], job_store: JobStore
) -> None:
    stores = [open_store() for _ in range(8)]  # a connection each, as 8 gateway replicas
    barrier = threading.Barrier(len(stores))
    made: list[str] = []
    errors: list[BaseException] = []

    def submit(i: int) -> None:
        barrier.wait()
        try:
            made.append(stores[i].create_job(job(f"j{i}"), max_active=100, request=key()).id)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(made) == 8 and len(set(made)) == 1
    assert [j for j in ("j0", "j1", "j2", "j3", "j4", "j5", "j6", "j7") if _exists(job_store, j)] == [made[0]]
    assert job_store.get_job(made[0]).state == JobState.QUEUED


def _exists(store: JobStore, job_id: str) -> bool:
    try:
        store.get_job(job_id)
        return True
    except NotFound:
        return False


_SUBMITTER = """
import sys
from services.jobs.store import open_job_store
from services.jobs.store.jobs import NewJob, RequestKey
store = open_job_store(sys.argv[1])
sys.stdin.readline()  # start together
job = NewJob(sys.argv[2], "a" * 24, "tenant:acme", b"", 0.4, 25.0, 10, [(0, 10)], tenant="acme")
print(store.create_job(job, request=RequestKey(sys.argv[3], "d1", 86400.0)).id)
store.close()
"""


def test_processes_racing_one_request_id_make_one_job(job_store: JobStore, store_url: str) -> None:
    results = race_processes(_SUBMITTER, [[store_url, f"p{i}", RID] for i in range(3)])
    for code, _, err in results:
        assert code == 0, err
    assert len({out.strip() for _, out, _ in results}) == 1
    assert sql(store_url, "SELECT count(*) FROM jobs") == [(1,)]


def test_a_version_7_database_gets_labels_request_ids_and_shared_keys(
    open_store: Callable[[], JobStore], store_url: str
) -> None:
    store = open_store()

    def make_version_7(tx) -> None:  # type: ignore[no-untyped-def]  # what lipline with schema 7 left behind
        for statement in schema(store.blob_type):  # type: ignore[attr-defined]
            tx.execute(statement)
        for version in range(2, 8):
            for statement in migration(version, store.blob_type):  # type: ignore[attr-defined]
                tx.execute(statement)
        tx.execute("INSERT INTO schema_version (version) VALUES (7)")
        tx.execute(
            "INSERT INTO jobs (id, avatar_id, owner, state, stage, options, audio_seconds, fps, total_frames, "
            "segments_total, create_time, tenant) VALUES ('old', 'a', 'o', 3, 'done', ?, 0.4, 25.0, 10, 1, 1.0, 'acme')",
            (b"",),
        )
        tx.execute(
            "INSERT INTO avatars (id, name, fps, frame_count, width, height, faces_found, create_time, tenant) "
            "VALUES ('av', 'n', 25.0, 1, 64, 64, 1, 1.0, 'acme')"
        )

    store._transaction(make_version_7)  # type: ignore[attr-defined]
    store.migrate()
    store.migrate()  # idempotent
    assert sql(store_url, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert store.get_job("old").labels == {} and store.get_avatar("av").labels == {}
    assert store.shared_key("k") == store.shared_key("k") and len(store.shared_key("k")) == 32
    assert store.shared_key("k") != store.shared_key("other")
    assert store.create_job(job("new", labels={"a": "b"}), request=key()).labels == {"a": "b"}
    assert json.loads(sql(store_url, "SELECT labels FROM jobs WHERE id = 'new'")[0][0]) == {"a": "b"}
