"""Every job store test runs twice: on SQLite (a file under tmp_path) and on a real PostgreSQL server.

One server for the whole session (started on a free port, stopped at the end); each test gets a
database of its own, so tests never see each other's jobs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from services.jobs.store import open_job_store
from services.jobs.store.jobs import JobStore
from tests.helpers.postgres import PostgresServer, missing_reason

_databases = itertools.count(1)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with PostgresServer() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh, empty database of each kind (not migrated)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/state/jobs.db"  # tmp_path is absolute: sqlite:////tmp/.../jobs.db
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database(f"test_{next(_databases)}")


@pytest.fixture
def open_store(store_url: str) -> Iterator[Callable[[], JobStore]]:
    """Open more stores on the test's database (what another gateway or worker process would see)."""
    opened: list[JobStore] = []

    def open_() -> JobStore:
        store = open_job_store(store_url)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


@pytest.fixture
def job_store(open_store: Callable[[], JobStore]) -> JobStore:
    store = open_store()
    store.migrate()
    return store
