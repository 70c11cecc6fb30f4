"""What the SQLite and PostgreSQL job stores share: the schema, the queries and the rules of a job's life.

The two stores differ only in how a transaction runs (BEGIN IMMEDIATE on one file, or a pooled
connection with row locks), whose clock counts, and how changes are announced (NOTIFY or nothing).
What claim, complete, cancel and the rest do is written once here, so both stores behave the same;
the SQL below is the subset both dialects accept, with `?` placeholders (PostgreSQL's store turns
them into `%s`).

Lock order on PostgreSQL (so two transactions never wait on each other in a circle): task rows of a
job before its job row, and a job's task rows in ascending index (the join, index -1, first). Every
transaction that changes several tasks of a job takes the join's row first; a claim holds a single
task row; a claim that finds a task out of attempts fails its job in a transaction of its own.
An avatar's row comes before everything else: create_job (with check_avatar) holds it FOR SHARE
while it inserts the job, DeleteAvatar's UPDATE and the purge's DELETE take it alone, so a job
inserted beside a delete is committed before the delete is, and the purge (after it) counts it.

Tenants: the gateway-facing reads and changes take a `tenant` and add `AND tenant = ?`; None (the
render workers) adds nothing.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from services.serving.errors import CorruptRecord, NotFound, TooLarge
from services.jobs.store import fair_claim
from services.serving.tenants import IMPLICIT_TENANT
from services.jobs.store.jobs import (
    JOIN_INDEX,
    AvatarRecord,
    ChangeFeed,
    Job,
    JobState,
    JobStore,
    NewJob,
    TERMINAL_STATES,
    QueueStats,
    Task,
    TaskState,
)

T = TypeVar("T")
Row = Mapping[str, Any]

SCHEMA_VERSION = 5
ABORTED = grpc.StatusCode.ABORTED.value[0]
CANCELLED = grpc.StatusCode.CANCELLED.value[0]
NOTIFY_CHANNEL = "lipline_jobs"
# Keys of the transaction-scoped advisory locks (PostgreSQL): one per purpose, arbitrary constants.
MIGRATE_LOCK = 0x6C69706C696E01
CREATE_LOCK = 0x6C69706C696E02

_ACTIVE = f"state IN ({int(JobState.QUEUED)}, {int(JobState.RUNNING)})"
_NOT_TERMINAL = f"state NOT IN ({', '.join(str(int(s)) for s in sorted(TERMINAL_STATES))})"
_WAITING, _LEASED, _BLOCKED, _DONE = (f"'{s.value}'" for s in (TaskState.WAITING, TaskState.LEASED, TaskState.BLOCKED, TaskState.DONE))


#: the statements that take the schema from version v - 1 to v (in one transaction with the others)
MIGRATIONS: dict[int, list[str]] = {
    # the job's trace context (W3C traceparent, as JSON), so every task's span joins the job's trace
    2: ["ALTER TABLE jobs ADD COLUMN trace_context TEXT NOT NULL DEFAULT ''"],
    # tenants (every row made before belongs to the implicit one), avatars' per-tenant content index
    # (an old avatar's id was its content hash) and deferred purge of deleted avatars
    3: [
        f"ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT '{IMPLICIT_TENANT}'",
        f"ALTER TABLE avatars ADD COLUMN tenant TEXT NOT NULL DEFAULT '{IMPLICIT_TENANT}'",
        "ALTER TABLE avatars ADD COLUMN content_hash TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE avatars ADD COLUMN deleted_time DOUBLE PRECISION NOT NULL DEFAULT 0",
        "UPDATE avatars SET content_hash = id",
        "CREATE INDEX IF NOT EXISTS jobs_avatar ON jobs (avatar_id)",
        "CREATE INDEX IF NOT EXISTS avatars_tenant ON avatars (tenant, create_time)",
        "CREATE UNIQUE INDEX IF NOT EXISTS avatars_content ON avatars (tenant, content_hash) WHERE content_hash <> '' AND deleted_time = 0",
    ],
    # retries over time (issue 17 item 11): a released task is claimable again only from not_before;
    # failing_since (when it first failed, the store's clock), failures and last_error let a worker
    # fail the job once the task has kept failing for longer than its retry window
    4: [
        "ALTER TABLE tasks ADD COLUMN not_before DOUBLE PRECISION NOT NULL DEFAULT 0",
        "ALTER TABLE tasks ADD COLUMN failing_since DOUBLE PRECISION NOT NULL DEFAULT 0",
        "ALTER TABLE tasks ADD COLUMN failures INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE tasks ADD COLUMN last_error TEXT NOT NULL DEFAULT ''",
    ],
    # the output's sha256 (hex), so DownloadOutput can tell a damaged output from a whole one; ''
    # for jobs that finished before it existed (their size is still checked)
    5: ["ALTER TABLE jobs ADD COLUMN output_sha256 TEXT NOT NULL DEFAULT ''"],
}


def schema(blob_type: str) -> list[str]:
    """The statements of schema version 1 (idempotent); `blob_type` is BLOB or BYTEA. A new
    database gets these, then every migration, exactly like an old one."""
    task_states = ", ".join(f"'{s.value}'" for s in TaskState)
    return [
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
        f"""CREATE TABLE IF NOT EXISTS jobs (
            id TEXT PRIMARY KEY,
            avatar_id TEXT NOT NULL,
            owner TEXT NOT NULL,
            state INTEGER NOT NULL,
            stage TEXT NOT NULL,
            options {blob_type} NOT NULL,
            audio_seconds DOUBLE PRECISION NOT NULL,
            fps DOUBLE PRECISION NOT NULL,
            total_frames INTEGER NOT NULL,
            frames_done INTEGER NOT NULL DEFAULT 0,
            segments_total INTEGER NOT NULL,
            segments_done INTEGER NOT NULL DEFAULT 0,
            error TEXT NOT NULL DEFAULT '',
            error_code INTEGER NOT NULL DEFAULT 0,
            models TEXT NOT NULL DEFAULT '[]',
            stage_seconds TEXT NOT NULL DEFAULT '{{}}',
            create_time DOUBLE PRECISION NOT NULL,
            start_time DOUBLE PRECISION NOT NULL DEFAULT 0,
            finish_time DOUBLE PRECISION NOT NULL DEFAULT 0,
            output_key TEXT NOT NULL DEFAULT '',
            output_bytes BIGINT NOT NULL DEFAULT 0,
            version BIGINT NOT NULL DEFAULT 1
        )""",
        "CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state)",
        "CREATE INDEX IF NOT EXISTS jobs_owner ON jobs (owner)",
        f"""CREATE TABLE IF NOT EXISTS tasks (
            job_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            state TEXT NOT NULL CHECK (state IN ({task_states})),
            start_frame INTEGER NOT NULL,
            end_frame INTEGER NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            token TEXT NOT NULL DEFAULT '',
            worker TEXT NOT NULL DEFAULT '',
            lease_expires DOUBLE PRECISION NOT NULL DEFAULT 0,
            ready_time DOUBLE PRECISION NOT NULL DEFAULT 0,
            PRIMARY KEY (job_id, idx)
        )""",
        "CREATE INDEX IF NOT EXISTS tasks_state ON tasks (state)",
        """CREATE TABLE IF NOT EXISTS avatars (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            fps DOUBLE PRECISION NOT NULL,
            frame_count INTEGER NOT NULL,
            width INTEGER NOT NULL,
            height INTEGER NOT NULL,
            faces_found INTEGER NOT NULL,
            create_time DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS avatars_create_time ON avatars (create_time)",
    ]


# -- rows <-> dataclasses, and the texts users read ----------------------------------------------------
def encode_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def job_from_row(row: Row) -> Job:
    """The row as a Job; CorruptRecord (DATA_LOSS) naming the field when it cannot be read (a state
    this lipline does not know, a field that is not JSON): a damaged row is reported, never a crash."""
    try:
        return _job_from_row(row)
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptRecord(f"job {row['id']!r} has a record this lipline cannot read ({_row_problem(row, exc)}); it cannot run") from exc


def _row_problem(row: Row, exc: Exception) -> str:
    """Which field of a job row is damaged, in words."""
    try:
        JobState(row["state"])
    except (ValueError, TypeError):
        return f"state {row['state']!r} is not one of {', '.join(f'{int(s)} ({s.name})' for s in JobState)}"
    for name in ("models", "stage_seconds"):
        try:
            json.loads(row[name])
        except (ValueError, TypeError):
            return f"its {name} field is not JSON: {str(row[name])[:80]!r}"
    return f"{type(exc).__name__}: {exc}"


def _job_from_row(row: Row) -> Job:
    return Job(
        id=row["id"],
        avatar_id=row["avatar_id"],
        owner=row["owner"],
        state=JobState(row["state"]),
        stage=row["stage"],
        options=bytes(row["options"]),
        audio_seconds=float(row["audio_seconds"]),
        fps=float(row["fps"]),
        total_frames=int(row["total_frames"]),
        frames_done=int(row["frames_done"]),
        segments_total=int(row["segments_total"]),
        segments_done=int(row["segments_done"]),
        error=row["error"],
        error_code=int(row["error_code"]),
        models=json.loads(row["models"]),
        stage_seconds=json.loads(row["stage_seconds"]),
        create_time=float(row["create_time"]),
        start_time=float(row["start_time"]),
        finish_time=float(row["finish_time"]),
        output_key=row["output_key"],
        output_bytes=int(row["output_bytes"]),
        version=int(row["version"]),
        trace_context=row["trace_context"],
        tenant=row["tenant"],
        output_sha256=row["output_sha256"],
    )


def avatar_from_row(row: Row) -> AvatarRecord:
    return AvatarRecord(**{f.name: row[f.name] for f in dataclasses.fields(AvatarRecord)})


def add_seconds(total: Mapping[str, float], more: Mapping[str, float]) -> dict[str, float]:
    out = dict(total)
    for stage, seconds in more.items():
        out[stage] = out.get(stage, 0.0) + float(seconds)
    return out


def task_name(job_id: str, index: int) -> str:
    return f"the join of job {job_id}" if index == JOIN_INDEX else f"segment {index} of job {job_id}"


def exhausted_message(job_id: str, index: int, attempts: int) -> str:
    return (
        f"{task_name(job_id, index)} was started {attempts} times and never finished: each time its "
        "render worker stopped renewing the lease (crashed, was evicted or lost the database) or gave it "
        "back after an error; see the render workers' logs"
    )


def too_many_message(active: int, limit: int, owner: str | None = None) -> str:
    who = f"client {owner!r} has" if owner is not None else "the service has"
    scope = " for one client" if owner is not None else ""
    return f"{who} {active} jobs queued or running (limit {limit}{scope}); retry later"


CANCELLED_MESSAGE = "the job was cancelled"


# -- transactions --------------------------------------------------------------------------------------
class Tx(abc.ABC):
    """One open transaction. SQL uses `?` placeholders; rows are mappings by column name."""

    @abc.abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a statement; the number of rows it changed."""

    @abc.abstractmethod
    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    @abc.abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock (Unix seconds): what leases are measured with."""

    def notify(self, job_id: str) -> None:
        """Announce, at commit, that the job changed."""

    def lock(self, key: int) -> None:
        """Hold a lock named `key` until the transaction ends (serializes e.g. limit checks)."""

    def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        rows = self.query(sql, params)
        return rows[0] if rows else None


@dataclasses.dataclass(frozen=True)
class _Exhausted:
    """A claim found a task out of attempts: its job must fail before the claim goes on."""

    job_id: str
    index: int
    attempts: int


class SqlJobStore(JobStore):
    """The JobStore over a `Tx`; subclasses supply `_transaction`, the dialect bits and the feed."""

    blob_type = "BLOB"
    row_lock = ""  # appended to SELECTs of rows the transaction will change (PostgreSQL: FOR UPDATE)
    share_lock = ""  # appended to SELECTs of rows that must not change before commit (PostgreSQL: FOR SHARE)
    claim_lock = ""  # appended to the claim's SELECT (PostgreSQL: FOR UPDATE OF t SKIP LOCKED)

    @abc.abstractmethod
    def _transaction(self, fn: Callable[[Tx], T], write: bool = True) -> T:
        """Run `fn` in one transaction (committed when it returns, rolled back when it raises);
        StoreUnavailable when the database cannot be reached."""

    # -- lifecycle ----------------------------------------------------------------------------------
    def migrate(self) -> None:
        def run(tx: Tx) -> None:
            tx.lock(MIGRATE_LOCK)
            for statement in schema(self.blob_type):
                tx.execute(statement)
            row = tx.one("SELECT max(version) AS version FROM schema_version")
            recorded = int(row["version"] or 0) if row else 0
            current = max(1, recorded)  # none recorded: the tables just made are version 1
            if current > SCHEMA_VERSION:
                raise RuntimeError(
                    f"the job store's schema is version {current}, newer than this lipline's "
                    f"({SCHEMA_VERSION}): upgrade lipline before pointing it at this database"
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version]:
                    tx.execute(statement)
            if recorded != SCHEMA_VERSION:
                tx.execute("DELETE FROM schema_version")
                tx.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))

        self._transaction(run)

    # -- reads used by feeds ------------------------------------------------------------------------
    def job_version(self, job_id: str) -> int:
        """The job's `version` (NotFound when absent): what a ChangeFeed compares against."""
        row = self._transaction(lambda tx: tx.one("SELECT version FROM jobs WHERE id = ?", (job_id,)), write=False)
        if row is None:
            raise NotFound(f"job {job_id!r} does not exist")
        return int(row["version"])

    def job_versions(self, job_ids: Sequence[str]) -> dict[str, int]:
        """Versions of those of `job_ids` that exist (one query per 500 ids)."""

        def run(tx: Tx) -> dict[str, int]:
            out: dict[str, int] = {}
            for i in range(0, len(job_ids), 500):
                chunk = list(job_ids[i : i + 500])
                marks = ", ".join("?" * len(chunk))
                for row in tx.query(f"SELECT id, version FROM jobs WHERE id IN ({marks})", chunk):
                    out[row["id"]] = int(row["version"])
            return out

        return self._transaction(run, write=False) if job_ids else {}

    # -- helpers inside a transaction ---------------------------------------------------------------
    def _job(self, tx: Tx, job_id: str, lock: bool = False, tenant: str | None = None) -> Job:
        mine = "" if tenant is None else " AND tenant = ?"
        params = (job_id,) if tenant is None else (job_id, tenant)
        row = tx.one("SELECT * FROM jobs WHERE id = ?" + mine + (self.row_lock if lock else ""), params)
        if row is None:
            raise NotFound(f"job {job_id!r} does not exist")
        return job_from_row(row)

    def _update_job(self, tx: Tx, job_id: str, only_if: str = "", **fields: Any) -> bool:
        """The one way a job row changes: bumps `version` and announces it. `only_if` is an extra
        SQL condition (e.g. that the job is still active); False when it did not hold."""
        sets = "".join(f"{name} = ?, " for name in fields)
        sql = f"UPDATE jobs SET {sets}version = version + 1 WHERE id = ?" + (f" AND {only_if}" if only_if else "")
        changed = tx.execute(sql, [*fields.values(), job_id]) > 0
        if changed:
            tx.notify(job_id)
        return changed

    def _lock_tasks(self, tx: Tx, job_id: str, join_only: bool = False) -> None:
        """Lock the job's task rows in the global order (PostgreSQL; SQLite's transaction is exclusive)."""
        if self.row_lock:
            where = f" AND idx = {JOIN_INDEX}" if join_only else ""
            tx.query(f"SELECT idx FROM tasks WHERE job_id = ?{where} ORDER BY idx{self.row_lock}", (job_id,))

    def _end_job(self, tx: Tx, job_id: str, **fields: Any) -> bool:
        """Delete the job's tasks (no worker can renew or complete them after) and, if it was still
        active, set `fields` (a terminal state). NotFound for an unknown job."""
        self._lock_tasks(tx, job_id)
        tx.execute("DELETE FROM tasks WHERE job_id = ?", (job_id,))
        # Not only QUEUED/RUNNING: a row in a state this lipline does not know is ended too (quarantined).
        if self._update_job(tx, job_id, only_if=_NOT_TERMINAL, finish_time=tx.now(), **fields):
            return True
        if tx.one("SELECT 1 AS x FROM jobs WHERE id = ?", (job_id,)) is None:
            raise NotFound(f"job {job_id!r} does not exist")
        return False  # it was already terminal

    @staticmethod
    def _finish_task(tx: Tx, task: Task) -> bool:
        """DONE, if `task` still holds the lease (its token); else False."""
        return (
            tx.execute(
                f"UPDATE tasks SET state = {_DONE}, lease_expires = 0 WHERE job_id = ? AND idx = ? AND token = ? AND state = {_LEASED}",
                (task.job_id, task.index, task.token),
            )
            > 0
        )

    # -- jobs ---------------------------------------------------------------------------------------
    def create_job(self, job: NewJob, max_active: int = 0, max_active_per_owner: int = 0, check_avatar: bool = False) -> Job:
        segments = [(int(start), int(end)) for start, end in job.segments]

        def run(tx: Tx) -> Job:
            if check_avatar:
                self._live_avatar(tx, job.avatar_id, job.tenant, self.share_lock)
            if max_active > 0 or max_active_per_owner > 0:
                tx.lock(CREATE_LOCK)
                if max_active > 0:
                    active = int(tx.one(f"SELECT count(*) AS n FROM jobs WHERE {_ACTIVE}")["n"])
                    if active >= max_active:
                        raise TooLarge(too_many_message(active, max_active))
                if max_active_per_owner > 0:
                    mine = int(tx.one(f"SELECT count(*) AS n FROM jobs WHERE owner = ? AND {_ACTIVE}", (job.owner,))["n"])
                    if mine >= max_active_per_owner:
                        raise TooLarge(too_many_message(mine, max_active_per_owner, job.owner))
            now = tx.now()
            values = {
                "id": job.id,
                "avatar_id": job.avatar_id,
                "owner": job.owner,
                "state": int(JobState.QUEUED),
                "stage": "queued",
                "options": bytes(job.options),
                "audio_seconds": float(job.audio_seconds),
                "fps": float(job.fps),
                "total_frames": int(job.total_frames),
                "segments_total": len(segments),
                "stage_seconds": encode_json({k: float(v) for k, v in job.stage_seconds.items()}),
                "create_time": now,
                "trace_context": job.trace_context,
                "tenant": job.tenant,
            }
            tx.execute(f"INSERT INTO jobs ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})", list(values.values()))
            join_state = TaskState.BLOCKED if segments else TaskState.WAITING
            rows = [(job.id, i, TaskState.WAITING.value, s, e, now) for i, (s, e) in enumerate(segments)]
            rows.append((job.id, JOIN_INDEX, join_state.value, 0, int(job.total_frames), now))
            tx.executemany(
                "INSERT INTO tasks (job_id, idx, state, start_frame, end_frame, ready_time) VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            tx.notify(job.id)
            return self._job(tx, job.id)

        return self._transaction(run)

    def get_job(self, job_id: str, tenant: str | None = None) -> Job:
        return self._transaction(lambda tx: self._job(tx, job_id, tenant=tenant), write=False)

    def cancel_job(self, job_id: str, tenant: str | None = None) -> Job:
        def run(tx: Tx) -> Job:
            if tenant is not None:
                self._job(tx, job_id, tenant=tenant)  # NotFound for another tenant's job
            self._end_job(tx, job_id, state=int(JobState.CANCELLED), stage="cancelled", error=CANCELLED_MESSAGE, error_code=CANCELLED)
            return self._job(tx, job_id)

        return self._transaction(run)

    def fail_job(self, job_id: str, error: str, error_code: int) -> bool:
        return self._transaction(lambda tx: self._end_job(tx, job_id, state=int(JobState.FAILED), stage="failed", error=error, error_code=int(error_code)))

    # -- tasks --------------------------------------------------------------------------------------
    def claim(self, worker: str, lease_s: float, max_attempts: int, max_owner_share: float = 1.0) -> Task | None:
        while True:
            found = self._transaction(lambda tx: self._claim_one(tx, worker, lease_s, max_attempts, max_owner_share))
            if not isinstance(found, _Exhausted):
                return found
            self.fail_job(found.job_id, exhausted_message(found.job_id, found.index, found.attempts), ABORTED)

    def _claim_one(self, tx: Tx, worker: str, lease_s: float, max_attempts: int, max_owner_share: float = 1.0) -> Task | _Exhausted | None:
        now = tx.now()
        row = tx.one(fair_claim.claim_select(self.claim_lock), fair_claim.claim_params(now, max_owner_share))
        if row is None:
            return None
        job_id, index, attempts = row["job_id"], int(row["idx"]), int(row["attempts"])
        if 0 < max_attempts <= attempts:
            return _Exhausted(job_id, index, attempts)
        # An expired lease became claimable when it expired.
        ready = float(row["lease_expires"] if row["state"] == TaskState.LEASED.value else max(row["ready_time"], row["not_before"]))
        token = uuid.uuid4().hex
        expires = now + lease_s
        tx.execute(
            f"UPDATE tasks SET state = {_LEASED}, attempts = attempts + 1, token = ?, worker = ?, "
            "lease_expires = ?, ready_time = ? WHERE job_id = ? AND idx = ?",
            (token, worker, expires, ready, job_id, index),
        )
        self._update_job(
            tx,
            job_id,
            only_if=f"state = {int(JobState.QUEUED)}",
            state=int(JobState.RUNNING),
            stage="join" if index == JOIN_INDEX else "render",
            start_time=now,
        )
        return Task(
            job_id=job_id,
            index=index,
            start_frame=int(row["start_frame"]),
            end_frame=int(row["end_frame"]),
            attempts=attempts + 1,
            token=token,
            lease_expires=expires,
            ready_time=ready,
            failures=int(row["failures"]),
            failing_for_s=max(0.0, now - float(row["failing_since"])) if row["failures"] else 0.0,
            last_error=row["last_error"],
        )

    def renew(self, task: Task, lease_s: float) -> bool:
        # An expired lease that nobody re-claimed is still this claim's: renewing it loses nothing.
        return self._transaction(
            lambda tx: (
                tx.execute(
                    f"UPDATE tasks SET lease_expires = ? WHERE job_id = ? AND idx = ? AND token = ? AND state = {_LEASED}",
                    (tx.now() + lease_s, task.job_id, task.index, task.token),
                )
                > 0
            )
        )

    def complete_segment(self, task: Task, frames: int, stage_seconds: dict[str, float], models: list[dict]) -> bool:
        if task.is_join:
            raise ValueError("complete_segment was given the join; use complete_join")

        def run(tx: Tx) -> bool:
            self._lock_tasks(tx, task.job_id, join_only=True)  # one completion of a job at a time
            if not self._finish_task(tx, task):
                return False
            job = self._job(tx, task.job_id, lock=True)
            done = job.segments_done + 1
            fields: dict[str, Any] = {
                "frames_done": job.frames_done + int(frames),
                "segments_done": done,
                "stage_seconds": encode_json(add_seconds(job.stage_seconds, stage_seconds)),
            }
            if models and not job.models:
                fields["models"] = encode_json(models)
            if done >= job.segments_total:
                fields["stage"] = "join"
                tx.execute(
                    f"UPDATE tasks SET state = {_WAITING}, ready_time = ? WHERE job_id = ? AND idx = ? AND state = {_BLOCKED}",
                    (tx.now(), task.job_id, JOIN_INDEX),
                )
            self._update_job(tx, task.job_id, **fields)
            return True

        return self._transaction(run)

    def complete_join(self, task: Task, output_key: str, output_bytes: int, stage_seconds: dict[str, float], output_sha256: str = "") -> bool:
        if not task.is_join:
            raise ValueError(f"complete_join was given segment {task.index}; use complete_segment")

        def run(tx: Tx) -> bool:
            if not self._finish_task(tx, task):
                return False
            job = self._job(tx, task.job_id)
            return self._end_job(
                tx,
                task.job_id,
                state=int(JobState.SUCCEEDED),
                stage="done",
                output_key=output_key,
                output_bytes=int(output_bytes),
                output_sha256=output_sha256,
                stage_seconds=encode_json(add_seconds(job.stage_seconds, stage_seconds)),
            )

        return self._transaction(run)

    def release(self, task: Task, count_attempt: bool = True, retry_delay_s: float = 0.0, error: str = "") -> None:
        def run(tx: Tx) -> None:
            now = tx.now()
            failed = ", failing_since = CASE WHEN failing_since = 0 THEN ? ELSE failing_since END, failures = failures + 1, last_error = ?" if error else ""
            tx.execute(
                f"UPDATE tasks SET state = {_WAITING}, token = '', worker = '', lease_expires = 0, ready_time = ?, not_before = ?, "
                f"attempts = attempts - ?{failed} WHERE job_id = ? AND idx = ? AND token = ? AND state = {_LEASED}",
                (
                    now,
                    now + max(0.0, float(retry_delay_s)),
                    0 if count_attempt else 1,
                    *((now, error[:2000]) if error else ()),
                    task.job_id,
                    task.index,
                    task.token,
                ),
            )

        self._transaction(run)

    def purge_orphan_tasks(self) -> int:
        return self._transaction(lambda tx: tx.execute("DELETE FROM tasks WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = tasks.job_id)"))

    def job_tasks_active(self, job_id: str) -> bool:
        return self._transaction(
            lambda tx: (
                tx.one(
                    f"SELECT 1 AS x FROM tasks WHERE job_id = ? AND state = {_LEASED} AND lease_expires > ? LIMIT 1",
                    (job_id, tx.now()),
                )
                is not None
            ),
            write=False,
        )

    def queue_stats(self) -> QueueStats:
        def run(tx: Tx) -> QueueStats:
            now = tx.now()
            claimable = f"(state = {_WAITING} OR (state = {_LEASED} AND lease_expires <= ?))"
            row = tx.one(
                f"SELECT count(*) AS n, min(CASE WHEN state = {_WAITING} THEN ready_time ELSE lease_expires END) AS oldest FROM tasks WHERE {claimable}",
                (now,),
            )
            leased = tx.one(f"SELECT count(*) AS n FROM tasks WHERE state = {_LEASED} AND lease_expires > ?", (now,))
            active = tx.one(f"SELECT count(*) AS n FROM jobs WHERE {_ACTIVE}")
            oldest = row["oldest"]
            return QueueStats(
                waiting=int(row["n"]),
                leased=int(leased["n"]),
                oldest_wait_s=max(0.0, now - float(oldest)) if oldest is not None else 0.0,
                active_jobs=int(active["n"]),
            )

        return self._transaction(run, write=False)

    # -- avatars ------------------------------------------------------------------------------------
    _LIVE = "deleted_time = 0"
    _UNUSED = f"NOT EXISTS (SELECT 1 FROM jobs j WHERE j.avatar_id = a.id AND j.{_ACTIVE})"

    def _live_avatar(self, tx: Tx, avatar_id: str, tenant: str | None, lock: str = "") -> AvatarRecord:
        mine = "" if tenant is None else " AND tenant = ?"
        params = (avatar_id,) if tenant is None else (avatar_id, tenant)
        row = tx.one(f"SELECT * FROM avatars WHERE id = ? AND {self._LIVE}{mine}{lock}", params)
        if row is None:
            raise NotFound(f"avatar {avatar_id!r} does not exist; create it with CreateAvatar")
        return avatar_from_row(row)

    def put_avatar(self, avatar: AvatarRecord) -> AvatarRecord:
        values = dataclasses.asdict(avatar)

        def run(tx: Tx) -> AvatarRecord:
            # No conflict target: a repeated id and the tenant's live content index both do nothing.
            tx.execute(
                f"INSERT INTO avatars ({', '.join(values)}) VALUES ({', '.join('?' * len(values))}) ON CONFLICT DO NOTHING",
                list(values.values()),
            )
            if avatar.content_hash and (same := self._find_avatar(tx, avatar.tenant, avatar.content_hash)) is not None:
                return same
            return avatar_from_row(tx.one("SELECT * FROM avatars WHERE id = ?", (avatar.id,)))  # type: ignore[arg-type]

        return self._transaction(run)

    def _find_avatar(self, tx: Tx, tenant: str, content_hash: str) -> AvatarRecord | None:
        row = tx.one(f"SELECT * FROM avatars WHERE tenant = ? AND content_hash = ? AND {self._LIVE}", (tenant, content_hash))
        return avatar_from_row(row) if row is not None else None

    def get_avatar(self, avatar_id: str, tenant: str | None = None) -> AvatarRecord:
        return self._transaction(lambda tx: self._live_avatar(tx, avatar_id, tenant), write=False)

    def find_avatar(self, tenant: str, content_hash: str) -> AvatarRecord | None:
        return self._transaction(lambda tx: self._find_avatar(tx, tenant, content_hash), write=False) if content_hash else None

    def list_avatars(self, limit: int = 1000, tenant: str | None = None) -> list[AvatarRecord]:
        mine = "" if tenant is None else " AND tenant = ?"
        params = (int(limit),) if tenant is None else (tenant, int(limit))
        rows = self._transaction(
            lambda tx: tx.query(f"SELECT * FROM avatars WHERE {self._LIVE}{mine} ORDER BY create_time, id LIMIT ?", params),
            write=False,
        )
        return [avatar_from_row(row) for row in rows]

    def delete_avatar(self, avatar_id: str, tenant: str | None = None) -> None:
        mine = "" if tenant is None else " AND tenant = ?"
        params: tuple = (avatar_id,) if tenant is None else (avatar_id, tenant)

        def run(tx: Tx) -> int:
            return tx.execute(f"UPDATE avatars SET deleted_time = ? WHERE id = ? AND {self._LIVE}{mine}", (tx.now(), *params))

        if not self._transaction(run):
            raise NotFound(f"avatar {avatar_id!r} does not exist")

    def purgeable_avatars(self, limit: int = 100, avatar_id: str | None = None) -> list[str]:
        one = "" if avatar_id is None else " AND a.id = ?"
        params = (int(limit),) if avatar_id is None else (avatar_id, int(limit))
        rows = self._transaction(
            lambda tx: tx.query(f"SELECT a.id FROM avatars a WHERE a.deleted_time > 0{one} AND {self._UNUSED} ORDER BY a.deleted_time, a.id LIMIT ?", params),
            write=False,
        )
        return [row["id"] for row in rows]

    def forget_avatar(self, avatar_id: str) -> bool:
        unused = self._UNUSED.replace("a.id", "avatars.id")  # DELETE takes no alias on SQLite
        return bool(self._transaction(lambda tx: tx.execute(f"DELETE FROM avatars WHERE id = ? AND deleted_time > 0 AND {unused}", (avatar_id,))))


# -- change feeds ------------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class _Waiter:
    after_version: int
    woken: asyncio.Future


class WaiterFeed(ChangeFeed):
    """The waiting half of a feed: coroutines park on futures (no threads); a subclass's `_run` task
    (polling, or LISTEN) wakes them. Starting and closing that task is the same for both stores."""

    def __init__(self, store: SqlJobStore) -> None:
        self._store = store
        self._waiters: dict[str, set[_Waiter]] = {}
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"lipline-{type(self).__name__}")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._wake_all()

    async def wait(self, job_id: str, after_version: int, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        waiter = _Waiter(after_version, loop.create_future())
        # Registered before the version is read: a change after the read wakes the future.
        self._waiters.setdefault(job_id, set()).add(waiter)
        try:
            if await asyncio.to_thread(self._store.job_version, job_id) > after_version:
                return
            remaining = deadline - loop.time()
            if remaining > 0:
                await asyncio.wait([waiter.woken], timeout=remaining)
        finally:
            waiters = self._waiters.get(job_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[job_id]

    def _watched(self) -> list[str]:
        return list(self._waiters)

    def _wake(self, job_id: str, version: int | None = None) -> None:
        """Wake the job's waiters (only those below `version` when it is known)."""
        for waiter in self._waiters.get(job_id, ()):
            if not waiter.woken.done() and (version is None or version > waiter.after_version):
                waiter.woken.set_result(None)

    def _wake_all(self) -> None:
        for job_id in list(self._waiters):
            self._wake(job_id)
