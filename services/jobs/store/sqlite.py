"""The job store in one SQLite file: the embedded default (one machine, any number of processes).

WAL mode lets readers run beside the one writer; every write transaction starts with BEGIN IMMEDIATE,
which takes the file's write lock up front, so a claim's read-then-update is atomic across the
render worker processes sharing the file (and two writers never deadlock upgrading a read lock).
Each thread has its own connection (sqlite3 connections are not for concurrent use); the clock is
this machine's `time.time()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from services.jobs.store.jobs import ChangeFeed
from services.jobs.store.sql.feed import WaiterFeed
from services.jobs.store.sql.store import SqlJobStore
from services.jobs.store.sql.tx import Row, Tx
from services.serving.errors import StoreUnavailable

T = TypeVar("T")
_LOGGER = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 30.0  # how long a transaction waits for another process's write lock
POLL_INTERVAL_S = 0.1
# OperationalErrors that mean "the file is busy or unreachable" (retry later), not a bug in our SQL.
_UNAVAILABLE_HINTS = ("locked", "busy", "unable to open", "disk i/o", "readonly", "no such file")


def sqlite_path(url: str) -> Path:
    """`sqlite:///relative.db` -> relative.db; `sqlite:////abs/path.db` -> /abs/path.db."""
    if not url.startswith("sqlite:///") or len(url) == len("sqlite:///"):
        raise ValueError(f"SQLite job store URL {url!r}: use sqlite:///relative/path.db or sqlite:////abs/path.db")
    return Path(url[len("sqlite:///") :])


class _Connection(sqlite3.Connection):
    """A connection close() can find through a weak reference (the plain class has none), so a
    thread's connection is closed when the thread ends instead of being kept open for close()."""


class _SqliteTx(Tx):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._conn.execute(sql, params).rowcount

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._conn.executemany(sql, rows)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._conn.execute(sql, params).fetchall()

    def now(self) -> float:
        return time.time()


class SqliteJobStore(SqlJobStore):
    def __init__(self, url: str, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.url = url
        self.path = sqlite_path(url)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: weakref.WeakSet[_Connection] = weakref.WeakSet()
        self._closed = False

    def _connection(self) -> _Connection:
        """This thread's connection (a new one after a fork: a parent's must not be shared)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        if self._closed:
            raise StoreUnavailable(f"the SQLite job store {self.path} is closed")
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
                factory=_Connection,
            )
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            self._enable_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")  # durable at checkpoints; safe against crashes in WAL
        except sqlite3.Error as e:
            raise self._unavailable(e) from e
        self._local.conn, self._local.pid = conn, os.getpid()
        with self._lock:
            self._conns.add(conn)
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        """Switch to WAL, retrying while another process does the same: the switch takes an exclusive
        lock and SQLite does not always run the busy handler for it ("database is locked" at once
        when several processes open a new file together)."""
        deadline = time.monotonic() + self._busy_timeout_s
        delay = 0.005
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e).lower() or time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.1)

    def _unavailable(self, e: sqlite3.Error) -> StoreUnavailable:
        return StoreUnavailable(f"the SQLite job store {self.path} cannot be used right now ({e}); retry later")

    def _transaction(self, fn: Callable[[Tx], T], write: bool = True) -> T:
        conn = self._connection()
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = fn(_SqliteTx(conn))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as e:
            if any(hint in str(e).lower() for hint in _UNAVAILABLE_HINTS):
                raise self._unavailable(e) from e
            raise
        return result

    def close(self) -> None:
        self._closed = True
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def change_feed(self) -> ChangeFeed:
        return SqliteChangeFeed(self)


class SqliteChangeFeed(WaiterFeed):
    """Polls the versions of the jobs someone waits on (one query per interval, none when idle):
    SQLite has no way to announce a change to other processes."""

    def __init__(self, store: SqliteJobStore, interval_s: float = POLL_INTERVAL_S) -> None:
        super().__init__(store)
        self._interval_s = interval_s

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            watched = self._watched()
            if not watched:
                continue
            try:
                versions = await asyncio.to_thread(self._store.job_versions, watched)
            except Exception as e:  # noqa: BLE001 - a busy file: the next poll tries again
                _LOGGER.warning("job feed: reading versions failed (%s); retrying", e)
                continue
            for job_id, version in versions.items():
                self._wake(job_id, version)
