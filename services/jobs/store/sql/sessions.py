"""Live sessions and live workers over a `Tx` (services.jobs.store.sessions has the contract): the SQL,
written once for SQLite and PostgreSQL, and the rules that end a session nobody holds.

Atomic leases without locks of our own: `lease_session` is one UPDATE whose WHERE says "unleased,
expired, or mine"; PostgreSQL re-checks it on the row a racing UPDATE just changed (READ
COMMITTED) and SQLite's writers run one at a time, so of two workers racing one changes the row
and the other changes nothing. A session's row comes after its avatar's (create_session holds the
avatar FOR SHARE while it inserts, as create_job does), and nothing else locks two session rows.
"""

from __future__ import annotations

import abc
import asyncio
import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import grpc

from services.jobs.store.jobs import AvatarRecord
from services.jobs.store.sessions import FOREVER, LiveWorker, SessionRow, SessionState, SessionStore
from services.jobs.store.sql.tx import Row, Tx
from services.serving.errors import NotFound, TooLarge

T = TypeVar("T")

ACTIVE = int(SessionState.ACTIVE)
DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
# The key of the transaction-scoped advisory lock that serializes the per-tenant session count (PostgreSQL).
CREATE_SESSION_LOCK = 0x6C69706C696E03
_CHUNK = 500  # ids per IN (...) list


def alive(prefix: str = "") -> str:
    """SQL: the session (columns prefixed with `prefix`, e.g. "s.") is ACTIVE and has not outlived its
    deadline or its idle timeout; takes two parameters, both the store's now."""
    p = prefix
    return f"{p}state = {ACTIVE} AND {p}deadline > ? AND {p}lease_expires + {p}idle_timeout_s > ?"


def expiry(row: Row, now: float) -> str | None:
    """Why an ACTIVE session row has ended by itself at `now` (a message for people), or None."""
    if int(row["state"]) != ACTIVE:
        return None
    if float(row["deadline"]) <= now:
        return f"the session reached its limit of {float(row['deadline']) - float(row['create_time']):g} s (max_session_seconds); create a new one"
    if float(row["lease_expires"]) + float(row["idle_timeout_s"]) <= now:
        return (
            f"no live worker held the session for {float(row['idle_timeout_s']):g} s (its idle timeout: its worker stopped and no "
            "Converse resumed it); create a new one"
        )
    return None


def session_from_row(row: Row, worker_address: str, now: float) -> SessionRow:
    state = SessionState(int(row["state"]))
    return SessionRow(
        id=row["id"],
        tenant=row["tenant"],
        avatar_id=row["avatar_id"],
        state=state,
        session=bytes(row["session"]),
        resume_token_sha256=row["resume_token_sha256"],
        worker_id=row["worker_id"],
        worker_address=worker_address,
        lease_expires=float(row["lease_expires"]),
        lease_live=state is SessionState.ACTIVE and bool(row["worker_id"]) and float(row["lease_expires"]) > now,
        create_time=float(row["create_time"]),
        deadline=float(row["deadline"]),
        idle_timeout_s=float(row["idle_timeout_s"]),
        end_time=float(row["end_time"]),
        error=row["error"],
        error_code=int(row["error_code"]),
    )


def too_many_sessions_message(tenant: str, active: int, limit: int) -> str:
    return f"tenant {tenant!r} has {active} live sessions open (limit {limit}); close one (CloseSession) or retry later"


class SqlSessionStore(SessionStore):
    """The session half of SqlJobStore (which supplies the transaction and the avatar check)."""

    row_lock: str  # the dialect's lock suffixes (SqlJobStore's)
    share_lock: str

    @abc.abstractmethod
    def _transaction(self, fn: Callable[[Tx], T], write: bool = True) -> T: ...

    @abc.abstractmethod
    def _live_avatar(self, tx: Tx, avatar_id: str, tenant: str | None, lock: str = "") -> AvatarRecord: ...

    async def _run(self, fn: Callable[[Tx], T], write: bool = True) -> T:
        """One transaction in a thread (see the contract's docstring: these are the asyncio callers')."""
        return await asyncio.to_thread(functools.partial(self._transaction, fn, write))

    # -- helpers inside a transaction ---------------------------------------------------------------
    def _session(self, tx: Tx, session_id: str, tenant: str | None) -> SessionRow:
        """The row (locked on PostgreSQL), ended first if it outlived its deadline or idle timeout."""
        mine = "" if tenant is None else " AND tenant = ?"
        params = (session_id,) if tenant is None else (session_id, tenant)
        row = tx.one(f"SELECT * FROM live_sessions WHERE id = ?{mine}{self.row_lock}", params)
        if row is None:
            raise NotFound(f"session {session_id!r} does not exist")
        now = tx.now()
        if (reason := expiry(row, now)) is not None:
            self._end(tx, session_id, SessionState.CLOSED, reason, DEADLINE_EXCEEDED)
            row = tx.one("SELECT * FROM live_sessions WHERE id = ?", (session_id,)) or row
        worker = (
            tx.one("SELECT address FROM live_workers WHERE id = ?", (row["worker_id"],)) if row["worker_id"] else None
        )
        return session_from_row(row, worker["address"] if worker else "", now)

    @staticmethod
    def _end(
        tx: Tx, session_id: str, state: SessionState, error: str, error_code: int, worker_id: str | None = None
    ) -> bool:
        if state is SessionState.ACTIVE:
            raise ValueError("a session ends CLOSED or FAILED, not ACTIVE")
        ours = "" if worker_id is None else " AND worker_id = ?"
        now = tx.now()
        params = [
            int(state),
            error[:2000],
            int(error_code),
            now,
            now,
            session_id,
            *(() if worker_id is None else (worker_id,)),
        ]
        sql = f"UPDATE live_sessions SET state = ?, error = ?, error_code = ?, end_time = ?, lease_expires = ? WHERE id = ? AND state = {ACTIVE}{ours}"
        return tx.execute(sql, params) > 0

    # -- live workers -------------------------------------------------------------------------------
    async def heartbeat_live_worker(
        self, worker_id: str, address: str, capacity: int, active: int, draining: bool
    ) -> None:
        def run(tx: Tx) -> None:
            tx.execute(
                "INSERT INTO live_workers (id, address, capacity, active, draining, heartbeat_time) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET address = excluded.address, capacity = excluded.capacity, active = excluded.active, "
                "draining = excluded.draining, heartbeat_time = excluded.heartbeat_time",
                (worker_id, address, int(capacity), int(active), int(bool(draining)), tx.now()),
            )

        await self._run(run)

    async def remove_live_worker(self, worker_id: str) -> None:
        await self._run(lambda tx: tx.execute("DELETE FROM live_workers WHERE id = ?", (worker_id,)))

    async def live_workers(self, fresh_s: float) -> list[LiveWorker]:
        def run(tx: Tx) -> list[LiveWorker]:
            now = tx.now()
            rows = tx.query(
                f"SELECT w.*, (SELECT count(*) FROM live_sessions s WHERE s.worker_id = w.id AND s.state = {ACTIVE} AND s.lease_expires > ?) "
                "AS leased FROM live_workers w WHERE w.heartbeat_time > ? AND w.draining = 0",
                (now, now - float(fresh_s)),
            )
            return [
                LiveWorker(
                    id=r["id"],
                    address=r["address"],
                    capacity=int(r["capacity"]),
                    active=int(r["active"]),
                    draining=bool(r["draining"]),
                    heartbeat_time=float(r["heartbeat_time"]),
                    leased=int(r["leased"]),
                )
                for r in rows
            ]

        workers = await self._run(run, write=False)
        return sorted(workers, key=lambda w: (-w.room, w.id))

    # -- sessions (live workers) --------------------------------------------------------------------
    async def lease_session(self, session_id: str, worker_id: str, lease_s: float) -> bool:
        def run(tx: Tx) -> bool:
            now = tx.now()
            return (
                tx.execute(
                    f"UPDATE live_sessions SET worker_id = ?, lease_expires = ? WHERE id = ? AND {alive()} "
                    "AND (worker_id = '' OR worker_id = ? OR lease_expires <= ?)",
                    (worker_id, now + float(lease_s), session_id, now, now, worker_id, now),
                )
                > 0
            )

        return await self._run(run)

    async def renew_session_leases(self, worker_id: str, session_ids: Iterable[str], lease_s: float) -> set[str]:
        ids = list(dict.fromkeys(session_ids))

        def run(tx: Tx) -> set[str]:
            now = tx.now()
            ours: set[str] = set()
            for i in range(0, len(ids), _CHUNK):
                chunk = ids[i : i + _CHUNK]
                marks = ", ".join("?" * len(chunk))
                where = f"worker_id = ? AND {alive()} AND id IN ({marks})"
                tx.execute(
                    f"UPDATE live_sessions SET lease_expires = ? WHERE {where}",
                    (now + float(lease_s), worker_id, now, now, *chunk),
                )
                ours.update(
                    r["id"]
                    for r in tx.query(f"SELECT id FROM live_sessions WHERE {where}", (worker_id, now, now, *chunk))
                )
            return ours

        return await self._run(run) if ids else set()

    async def release_session(self, session_id: str, worker_id: str) -> bool:
        def run(tx: Tx) -> bool:
            sql = f"UPDATE live_sessions SET worker_id = '', lease_expires = ? WHERE id = ? AND worker_id = ? AND state = {ACTIVE}"
            return tx.execute(sql, (tx.now(), session_id, worker_id)) > 0

        return await self._run(run)

    async def end_session(
        self, session_id: str, worker_id: str, state: SessionState, error: str, error_code: int
    ) -> bool:
        state = SessionState(state)
        return await self._run(lambda tx: self._end(tx, session_id, state, error, error_code, worker_id=worker_id))

    async def get_session_row(self, session_id: str) -> SessionRow:
        return await self._run(lambda tx: self._session(tx, session_id, None))

    # -- sessions (gateway) -------------------------------------------------------------------------
    async def create_session(
        self,
        tenant: str,
        session_id: str,
        avatar_id: str,
        session_bytes: bytes,
        resume_token_sha256: str,
        *,
        max_seconds: float = 0.0,
        idle_timeout_s: float = 0.0,
        max_per_tenant: int = 0,
    ) -> SessionRow:
        def run(tx: Tx) -> SessionRow:
            self._live_avatar(tx, avatar_id, tenant, self.share_lock)
            now = tx.now()
            if max_per_tenant > 0:
                tx.lock(CREATE_SESSION_LOCK)
                mine = int(
                    tx.query(
                        f"SELECT count(*) AS n FROM live_sessions WHERE tenant = ? AND {alive()}", (tenant, now, now)
                    )[0]["n"]
                )
                if mine >= max_per_tenant:
                    raise TooLarge(too_many_sessions_message(tenant, mine, max_per_tenant))
            values: dict[str, Any] = {
                "id": session_id,
                "tenant": tenant,
                "avatar_id": avatar_id,
                "state": ACTIVE,
                "session": bytes(session_bytes),
                "resume_token_sha256": resume_token_sha256,
                "lease_expires": now,  # unheld since now: the idle timeout counts from here
                "create_time": now,
                "deadline": now + float(max_seconds) if max_seconds > 0 else FOREVER,
                "idle_timeout_s": float(idle_timeout_s) if idle_timeout_s > 0 else FOREVER,
            }
            tx.execute(
                f"INSERT INTO live_sessions ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})",
                list(values.values()),
            )
            return self._session(tx, session_id, tenant)

        return await self._run(run)

    async def get_session(self, tenant: str, session_id: str) -> SessionRow:
        return await self._run(lambda tx: self._session(tx, session_id, tenant))

    async def close_session(
        self, tenant: str, session_id: str, error: str = "closed by CloseSession", error_code: int = 0
    ) -> SessionRow:
        def run(tx: Tx) -> SessionRow:
            if self._session(tx, session_id, tenant).active:
                self._end(tx, session_id, SessionState.CLOSED, error, error_code)
            return self._session(tx, session_id, tenant)

        return await self._run(run)

    async def delete_session(self, tenant: str, session_id: str) -> None:
        await self._run(
            lambda tx: tx.execute("DELETE FROM live_sessions WHERE id = ? AND tenant = ?", (session_id, tenant))
        )
