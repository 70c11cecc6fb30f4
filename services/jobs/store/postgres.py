"""The job store on PostgreSQL: what a cluster of gateways and render workers shares.

A small psycopg connection pool serves the synchronous calls; every connection is checked before
use, so the dead ones left by a database restart are replaced instead of failing a request. Claims
lock the chosen task with SELECT ... FOR UPDATE SKIP LOCKED (workers never queue behind each other);
leases and times use the database's clock, so workers with skewed clocks agree. Every job change
sends NOTIFY lipline_jobs (payload: the job id) in its transaction; `PostgresChangeFeed` LISTENs.
A database that cannot be reached raises StoreUnavailable within about POOL_TIMEOUT_S (2 s: shorter
than the 5-10 s deadlines clients use, so they get a status instead of a timeout), never hangs; the
pool keeps reconnecting with a back-off that restarts every RECONNECT_TIMEOUT_S, so work resumes
within seconds of the database coming back, however long it was away.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from services.jobs.store.jobs import ChangeFeed
from services.jobs.store.sql.feed import NOTIFY_CHANNEL, WaiterFeed
from services.jobs.store.sql.store import SqlJobStore
from services.jobs.store.sql.tx import Row, Tx
from services.serving.errors import StoreUnavailable

T = TypeVar("T")
_LOGGER = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2
POOL_TIMEOUT_S = 2.0
# psycopg_pool doubles its reconnection delay (1, 2, 4 ... s) until this, then gives up that attempt;
# the next request starts a fresh one. Short, so the delay never grows past a few seconds.
RECONNECT_TIMEOUT_S = 10.0
# Detect a peer that vanished without closing (network partition, killed node) within ~30 s.
CONNECT_KWARGS: dict[str, Any] = {
    "connect_timeout": CONNECT_TIMEOUT_S,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "application_name": "lipline",
}
# Conflicts PostgreSQL resolves by aborting one transaction; running it again is the remedy.
_RETRYABLE = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
_TX_ATTEMPTS = 3


@functools.lru_cache(maxsize=512)
def _pg(sql: str) -> str:
    """Our SQL's `?` placeholders as psycopg's `%s` (the shared SQL has no other `?` or `%`)."""
    return sql.replace("?", "%s")


def describe(url: str) -> str:
    """host:port/dbname of a URL, without the password (for messages and logs)."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(unparsable URL)"
    return f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


class _PgTx(Tx):
    def __init__(self, cur: psycopg.Cursor[Any]) -> None:  # rows are dicts: the pool's row_factory is dict_row
        self._cur = cur
        self._now: float | None = None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        self._cur.execute(_pg(sql), params)
        return self._cur.rowcount

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._cur.executemany(_pg(sql), rows)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        self._cur.execute(_pg(sql), params)
        return self._cur.fetchall()

    def now(self) -> float:
        """The database's clock, read once per transaction (one consistent "now" for its statements)."""
        if self._now is None:
            row = self._cur.execute("SELECT extract(epoch FROM clock_timestamp())::float8 AS now").fetchone()
            if row is None:  # a SELECT of one expression returns one row
                raise LookupError("SELECT clock_timestamp() returned no row")
            self._now = float(row["now"])
        return self._now

    def notify(self, job_id: str) -> None:
        self._cur.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, job_id))

    def lock(self, key: int) -> None:
        self._cur.execute("SELECT pg_advisory_xact_lock(%s)", (key,))


class PostgresJobStore(SqlJobStore):
    blob_type = "BYTEA"
    row_lock = " FOR UPDATE"
    share_lock = " FOR SHARE"
    claim_lock = " FOR UPDATE OF t SKIP LOCKED"

    def __init__(self, url: str, min_size: int = 1, max_size: int = 8, pool_timeout_s: float = POOL_TIMEOUT_S) -> None:
        self.url = url
        self.where = describe(url)
        self.pool_timeout_s = pool_timeout_s
        self._pool = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs={**CONNECT_KWARGS, "autocommit": True, "row_factory": dict_row},
            check=self._check_connection,  # replaces connections a server restart killed
            timeout=pool_timeout_s,
            reconnect_timeout=RECONNECT_TIMEOUT_S,
            name="lipline-jobs",
            open=True,  # connects in the background; the first call waits for it (at most timeout)
        )

    def _check_connection(self, conn: psycopg.Connection) -> None:
        """The pool's check before lending a connection. One dead connection usually means a database
        restart killed them all: drop every idle dead one now, or each would cost the borrower one
        more of the pool's growing back-off sleeps (1, 2, 4 s ...) before it reached a live one."""
        try:
            ConnectionPool.check_connection(conn)
        except Exception:
            _LOGGER.info("job store: a pooled connection to %s was dead; checking the others", self.where)
            self._pool.check()
            raise

    def _transaction(self, fn: Callable[[Tx], T], write: bool = True) -> T:
        for attempt in range(1, _TX_ATTEMPTS + 1):
            try:
                with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                    return fn(_PgTx(cur))
            except _RETRYABLE as e:
                if attempt == _TX_ATTEMPTS:
                    raise StoreUnavailable(
                        f"the PostgreSQL job store at {self.where} kept aborting a transaction ({e.sqlstate}: {e}); retry later"
                    ) from e
                _LOGGER.info("job store: transaction aborted (%s), running it again", e.sqlstate)
            except PoolTimeout as e:
                raise StoreUnavailable(
                    f"the PostgreSQL job store at {self.where} gave no connection within {self.pool_timeout_s:g} s "
                    f"(is the database up and reachable?); retry later"
                ) from e
            except psycopg.OperationalError as e:
                raise StoreUnavailable(
                    f"the PostgreSQL job store at {self.where} cannot be reached ({str(e).strip() or type(e).__name__}); retry later"
                ) from e
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._pool.close()

    def change_feed(self) -> ChangeFeed:
        return PostgresChangeFeed(self)


class PostgresChangeFeed(WaiterFeed):
    """LISTEN on its own connection (asyncio: no thread); NOTIFY payloads wake that job's waiters.

    A lost connection is reopened with back-off, and every waiter is woken then (a NOTIFY sent
    while nobody listened is gone; the waiters re-read their job instead).
    """

    IDLE_PROBE_S = 10.0  # with no notification for this long, check that the connection still works
    BACKOFF_S = (0.2, 2.0)

    def __init__(self, store: PostgresJobStore) -> None:
        super().__init__(store)
        self._url = store.url
        self._where = store.where
        self._connected = asyncio.Event()
        self.connections = 0  # how many times it has started listening (1 + reconnections)

    async def start(self) -> None:
        """Start listening; waits (a few seconds at most) for the first connection, never fails."""
        await super().start()
        await self.wait_connected(CONNECT_TIMEOUT_S)

    async def wait_connected(self, timeout: float) -> bool:
        """Whether the feed is LISTENing, waiting up to `timeout` seconds for it (tests, readiness)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._connected.wait(), timeout)
        return self._connected.is_set()

    async def _run(self) -> None:
        delay = self.BACKOFF_S[0]
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True, **CONNECT_KWARGS)
                async with conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self.connections += 1
                    self._connected.set()
                    if delay > self.BACKOFF_S[0]:
                        _LOGGER.info("job feed: listening again on %s", self._where)
                    delay = self.BACKOFF_S[0]
                    self._wake_all()  # whatever changed while nobody listened
                    while True:
                        async for note in conn.notifies(timeout=self.IDLE_PROBE_S):
                            self._wake(note.payload)
                        await conn.execute("SELECT 1")
            except Exception as e:  # noqa: BLE001 - any loss: reconnect; waiters re-read their jobs
                self._connected.clear()
                self._wake_all()
                _LOGGER.warning(
                    "job feed: connection to %s lost or refused (%s); retrying in %.1f s",
                    self._where,
                    str(e).strip() or type(e).__name__,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.BACKOFF_S[1])

    async def close(self) -> None:
        self._connected.clear()
        await super().close()
