"""The JobStore over a `Tx`: what claim, complete, cancel and the rest do, written once for both
dialects (see the package's docstring for the lock order and tenants)."""

from __future__ import annotations

import abc
import secrets
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from services.jobs.layout import job_tasks
from services.jobs.store.fair_claim import claim_params, claim_select
from services.jobs.store.jobs import (
    AvatarRecord,
    Delivery,
    Job,
    JobFilter,
    JobState,
    JobStore,
    NewJob,
    PageCursor,
    QueueStats,
    RequestKey,
    RequestKind,
    RequestRecord,
    Task,
    TaskKind,
    TaskState,
    UnreadableRecord,
)
from services.jobs.store.sql import retention
from services.jobs.store.sql.requests import claim_request, find_request, forget_requests, retarget_request
from services.jobs.store.sql.rows import (
    add_seconds,
    avatar_from_row,
    avatar_to_row,
    encode_json,
    job_from_row,
    listed,
)
from services.jobs.store.sql.rules import (
    ABORTED,
    ACTIVE,
    BLOCKED,
    CANCELLED,
    CANCELLED_MESSAGE,
    DONE,
    JOIN,
    LEASED,
    NOT_TERMINAL,
    WAITING,
    Exhausted,
    claimable_since,
    exhausted_message,
    failing_for_s,
    job_stage_at_claim,
    out_of_attempts,
    too_many_message,
)
from services.jobs.store.sql.schema import migrate
from services.jobs.store.sql.sessions import SqlSessionStore, alive
from services.jobs.store.sql.tx import Tx
from services.jobs.store.sql.webhooks import claim_delivery, delivery_from_row, enqueue_delivery, finish_delivery
from services.serving.errors import FailedPrecondition, NoCapacity, NotFound

T = TypeVar("T")

# The key of the transaction-scoped advisory lock that serializes limit checks (PostgreSQL); arbitrary.
CREATE_LOCK = 0x6C69706C696E02
_NEWEST_FIRST = " ORDER BY create_time DESC, id DESC LIMIT ?"


def _after(cursor: PageCursor | None, alias: str = "") -> tuple[str, tuple]:
    """The keyset condition of the page after `cursor` in newest-first (create_time, id) order."""
    if cursor is None:
        return "", ()
    t, i = f"{alias}create_time", f"{alias}id"
    return f" AND ({t} < ? OR ({t} = ? AND {i} < ?))", (cursor.create_time, cursor.create_time, cursor.id)


def _job_filter(where: JobFilter) -> tuple[str, list]:
    """ListJobs' filters as SQL conditions (each prefixed with AND) and their parameters."""
    sql, params = "", list[object]()
    if where.states:
        states = sorted(int(s) for s in where.states)
        sql += f" AND state IN ({', '.join('?' * len(states))})"
        params += states
    if where.created_after is not None:
        sql += " AND create_time >= ?"
        params.append(where.created_after)
    if where.created_before is not None:
        sql += " AND create_time < ?"
        params.append(where.created_before)
    for key, value in sorted(where.labels.items()):
        sql += " AND EXISTS (SELECT 1 FROM job_labels l WHERE l.job_id = jobs.id AND l.label_key = ? AND l.label_value = ?)"
        params += [key, value]
    return sql, params


class SqlJobStore(SqlSessionStore, JobStore):
    """The JobStore over a `Tx`; subclasses supply `_transaction`, the dialect bits and the feed. Live
    sessions and workers are SqlSessionStore's."""

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
        self._transaction(lambda tx: migrate(tx, self.blob_type))

    # -- reads used by feeds ------------------------------------------------------------------------
    def job_version(self, job_id: str) -> int:
        """The job's `version` (NotFound when absent): what a ChangeFeed compares against."""
        row = self._transaction(lambda tx: tx.one("SELECT version FROM jobs WHERE id = ?", (job_id,)), write=False)
        if row is None:
            raise NotFound(f"job {job_id!r} does not exist")
        return int(row["version"])

    def job_versions(self, job_ids: Sequence[str]) -> dict[str, int]:
        """Versions of those of `job_ids` that exist (one query per 500 ids)."""
        rows = self._rows_of("SELECT id, version FROM jobs", job_ids)
        return {row["id"]: int(row["version"]) for row in rows}

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
            where = f" AND kind = {JOIN}" if join_only else ""
            tx.query(f"SELECT idx FROM tasks WHERE job_id = ?{where} ORDER BY idx{self.row_lock}", (job_id,))

    def _end_job(self, tx: Tx, job_id: str, **fields: Any) -> bool:
        """Delete the job's tasks (no worker can renew or complete them after) and, if it was still
        active, set `fields` (a terminal state). NotFound for an unknown job."""
        self._lock_tasks(tx, job_id)
        tx.execute("DELETE FROM tasks WHERE job_id = ?", (job_id,))
        # Not only QUEUED/RUNNING: a row in a state this lipline does not know is ended too (quarantined).
        if self._update_job(tx, job_id, only_if=NOT_TERMINAL, finish_time=tx.now(), **fields):
            enqueue_delivery(tx, job_id)  # the webhook, if any: in this transaction, so it is never lost
            return True
        if tx.one("SELECT 1 AS x FROM jobs WHERE id = ?", (job_id,)) is None:
            raise NotFound(f"job {job_id!r} does not exist")
        return False  # it was already terminal

    @staticmethod
    def _finish_task(tx: Tx, task: Task) -> bool:
        """DONE, if `task` still holds the lease (its token); else False."""
        return (
            tx.execute(
                f"UPDATE tasks SET state = {DONE}, lease_expires = 0 WHERE job_id = ? AND idx = ? AND token = ? AND state = {LEASED}",
                (task.job_id, task.index, task.token),
            )
            > 0
        )

    # -- jobs ---------------------------------------------------------------------------------------
    def create_job(
        self,
        job: NewJob,
        max_active: int = 0,
        max_active_per_owner: int = 0,
        check_avatar: bool = False,
        request: RequestKey | None = None,
    ) -> Job:
        segments = [(int(start), int(end)) for start, end in job.segments]

        def run(tx: Tx) -> Job:
            if request is not None:  # first: a repeat checks nothing else and inserts nothing
                earlier = claim_request(tx, job.tenant, RequestKind.JOB, request, job.id)
                if earlier is not None:
                    return self._job(tx, earlier, tenant=job.tenant)
            if check_avatar:
                self._live_avatar(tx, job.avatar_id, job.tenant, self.share_lock)
            if max_active > 0 or max_active_per_owner > 0:
                tx.lock(CREATE_LOCK)
                if max_active > 0:
                    active = int(tx.only(f"SELECT count(*) AS n FROM jobs WHERE {ACTIVE}")["n"])
                    if active >= max_active:
                        raise NoCapacity(too_many_message(active, max_active))
                if max_active_per_owner > 0:
                    mine = int(
                        tx.only(f"SELECT count(*) AS n FROM jobs WHERE owner = ? AND {ACTIVE}", (job.owner,))["n"]
                    )
                    if mine >= max_active_per_owner:
                        raise NoCapacity(too_many_message(mine, max_active_per_owner, job.owner))
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
                "labels": encode_json(dict(job.labels)),
                "callback_url": job.callback_url,
                "model": job.model,
            }
            tx.execute(
                f"INSERT INTO jobs ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})", list(values.values())
            )
            tx.executemany(
                "INSERT INTO job_labels (job_id, label_key, label_value) VALUES (?, ?, ?)",
                [(job.id, key, value) for key, value in job.labels.items()],
            )
            tasks = job_tasks(segments, job.total_frames, job.audio_task)
            join_state = TaskState.BLOCKED if len(tasks) > 1 else TaskState.WAITING
            rows = [
                (
                    job.id,
                    t.index,
                    t.kind.value,
                    (join_state if t.kind is TaskKind.JOIN else TaskState.WAITING).value,
                    t.start_frame,
                    t.end_frame,
                    now,
                )
                for t in tasks
            ]
            tx.executemany(
                "INSERT INTO tasks (job_id, idx, kind, state, start_frame, end_frame, ready_time) VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            tx.notify(job.id)
            return self._job(tx, job.id)

        return self._transaction(run)

    def get_job(self, job_id: str, tenant: str | None = None) -> Job:
        return self._transaction(lambda tx: self._job(tx, job_id, tenant=tenant), write=False)

    def list_jobs(
        self, tenant: str, where: JobFilter, after: PageCursor | None = None, limit: int = 50
    ) -> list[Job | UnreadableRecord]:
        filters, params = _job_filter(where)
        page, cursor = _after(after)
        rows = self._transaction(
            lambda tx: tx.query(
                f"SELECT * FROM jobs WHERE tenant = ?{filters}{page}{_NEWEST_FIRST}",
                (tenant, *params, *cursor, int(limit)),
            ),
            write=False,
        )
        return [listed(row, job_from_row) for row in rows]

    def delete_job(self, job_id: str, tenant: str | None = None) -> Job:
        def run(tx: Tx) -> Job:
            self._lock_tasks(tx, job_id)  # the lock order: task rows (a terminal job has none) before the job's
            job = self._job(tx, job_id, lock=True, tenant=tenant)
            if not job.terminal:
                raise FailedPrecondition(
                    f"job {job_id} is {job.state.name}; cancel it first (CancelJob), then delete it"
                )
            tx.execute("DELETE FROM tasks WHERE job_id = ?", (job_id,))
            tx.execute("DELETE FROM job_labels WHERE job_id = ?", (job_id,))
            forget_requests(tx, RequestKind.JOB, job_id)
            tx.execute("DELETE FROM webhooks WHERE job_id = ?", (job_id,))  # its body was the job
            tx.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            tx.notify(job_id)
            return job

        return self._transaction(run)

    # -- request ids and shared keys ----------------------------------------------------------------
    def find_request(self, tenant: str, kind: RequestKind, request_id: str, window_s: float) -> RequestRecord | None:
        return self._transaction(lambda tx: find_request(tx, tenant, kind, request_id, window_s), write=False)

    def purge_requests(self, older_than_s: float) -> int:
        return self._transaction(
            lambda tx: tx.execute("DELETE FROM request_ids WHERE create_time <= ?", (tx.now() - older_than_s,))
        )

    def shared_key(self, name: str) -> bytes:
        def run(tx: Tx) -> bytes:
            tx.execute(
                "INSERT INTO shared_keys (name, value) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (name, secrets.token_hex(32)),
            )
            return bytes.fromhex(tx.only("SELECT value FROM shared_keys WHERE name = ?", (name,))["value"])

        return self._transaction(run)

    def cancel_job(self, job_id: str, tenant: str | None = None) -> Job:
        def run(tx: Tx) -> Job:
            if tenant is not None:
                self._job(tx, job_id, tenant=tenant)  # NotFound for another tenant's job
            self._end_job(
                tx,
                job_id,
                state=int(JobState.CANCELLED),
                stage="cancelled",
                error=CANCELLED_MESSAGE,
                error_code=CANCELLED,
            )
            return self._job(tx, job_id)

        return self._transaction(run)

    def fail_job(self, job_id: str, error: str, error_code: int) -> bool:
        return self._transaction(
            lambda tx: self._end_job(
                tx, job_id, state=int(JobState.FAILED), stage="failed", error=error, error_code=int(error_code)
            )
        )

    # -- tasks --------------------------------------------------------------------------------------
    def claim(self, worker: str, lease_s: float, max_attempts: int, max_owner_share: float = 1.0) -> Task | None:
        while True:
            found = self._transaction(lambda tx: self._claim_one(tx, worker, lease_s, max_attempts, max_owner_share))
            if not isinstance(found, Exhausted):
                return found
            self.fail_job(
                found.job_id, exhausted_message(found.job_id, found.kind, found.index, found.attempts), ABORTED
            )

    def _claim_one(
        self, tx: Tx, worker: str, lease_s: float, max_attempts: int, max_owner_share: float = 1.0
    ) -> Task | Exhausted | None:
        now = tx.now()
        row = tx.one(claim_select(self.claim_lock), claim_params(now, max_owner_share))
        if row is None:
            return None
        job_id, index, attempts = row["job_id"], int(row["idx"]), int(row["attempts"])
        kind = TaskKind(row["kind"])
        if out_of_attempts(attempts, max_attempts):
            return Exhausted(job_id, kind, index, attempts)
        ready = claimable_since(row)
        token = uuid.uuid4().hex
        expires = now + lease_s
        tx.execute(
            f"UPDATE tasks SET state = {LEASED}, attempts = attempts + 1, token = ?, worker = ?, "
            "lease_expires = ?, ready_time = ? WHERE job_id = ? AND idx = ?",
            (token, worker, expires, ready, job_id, index),
        )
        self._update_job(
            tx,
            job_id,
            only_if=f"state = {int(JobState.QUEUED)}",
            state=int(JobState.RUNNING),
            stage=job_stage_at_claim(kind),
            start_time=now,
        )
        return Task(
            job_id=job_id,
            index=index,
            kind=kind,
            start_frame=int(row["start_frame"]),
            end_frame=int(row["end_frame"]),
            attempts=attempts + 1,
            token=token,
            lease_expires=expires,
            ready_time=ready,
            failures=int(row["failures"]),
            failing_for_s=failing_for_s(row, now),
            last_error=row["last_error"],
        )

    def renew(self, task: Task, lease_s: float) -> bool:
        # An expired lease that nobody re-claimed is still this claim's: renewing it loses nothing.
        return self._transaction(
            lambda tx: (
                tx.execute(
                    f"UPDATE tasks SET lease_expires = ? WHERE job_id = ? AND idx = ? AND token = ? AND state = {LEASED}",
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
            fields: dict[str, Any] = {
                "frames_done": job.frames_done + int(frames),
                "stage_seconds": encode_json(add_seconds(job.stage_seconds, stage_seconds)),
            }
            if task.kind is TaskKind.SEGMENT:
                fields["segments_done"] = job.segments_done + 1
            if models and not job.models:
                fields["models"] = encode_json(models)
            others = tx.one(
                f"SELECT count(*) AS n FROM tasks WHERE job_id = ? AND kind <> {JOIN} AND state <> {DONE}",
                (task.job_id,),
            )
            if others is not None and int(others["n"]) == 0:  # the last of them: the join may start
                fields["stage"] = "join"
                tx.execute(
                    f"UPDATE tasks SET state = {WAITING}, ready_time = ? WHERE job_id = ? AND kind = {JOIN} AND state = {BLOCKED}",
                    (tx.now(), task.job_id),
                )
            self._update_job(tx, task.job_id, **fields)
            return True

        return self._transaction(run)

    def complete_join(
        self,
        task: Task,
        output_key: str,
        output_bytes: int,
        stage_seconds: dict[str, float],
        output_sha256: str = "",
        output_ttl_s: float = 0.0,
    ) -> bool:
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
                output_expire_time=tx.now() + float(output_ttl_s) if output_ttl_s > 0 else 0.0,
            )

        return self._transaction(run)

    def release(self, task: Task, count_attempt: bool = True, retry_delay_s: float = 0.0, error: str = "") -> None:
        def run(tx: Tx) -> None:
            now = tx.now()
            failed = (
                ", failing_since = CASE WHEN failing_since = 0 THEN ? ELSE failing_since END, failures = failures + 1, last_error = ?"
                if error
                else ""
            )
            tx.execute(
                f"UPDATE tasks SET state = {WAITING}, token = '', worker = '', lease_expires = 0, ready_time = ?, not_before = ?, "
                f"attempts = attempts - ?{failed} WHERE job_id = ? AND idx = ? AND token = ? AND state = {LEASED}",
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
        return self._transaction(
            lambda tx: tx.execute("DELETE FROM tasks WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = tasks.job_id)")
        )

    def job_tasks_active(self, job_id: str) -> bool:
        return self._transaction(
            lambda tx: (
                tx.one(
                    f"SELECT 1 AS x FROM tasks WHERE job_id = ? AND state = {LEASED} AND lease_expires > ? LIMIT 1",
                    (job_id, tx.now()),
                )
                is not None
            ),
            write=False,
        )

    def queue_stats(self) -> QueueStats:
        def run(tx: Tx) -> QueueStats:
            now = tx.now()
            claimable = f"(state = {WAITING} OR (state = {LEASED} AND lease_expires <= ?))"
            row = tx.only(
                f"SELECT count(*) AS n, min(CASE WHEN state = {WAITING} THEN ready_time ELSE lease_expires END) AS oldest FROM tasks WHERE {claimable}",
                (now,),
            )
            leased = tx.only(f"SELECT count(*) AS n FROM tasks WHERE state = {LEASED} AND lease_expires > ?", (now,))
            active = tx.only(f"SELECT count(*) AS n FROM jobs WHERE {ACTIVE}")
            oldest = row["oldest"]
            return QueueStats(
                waiting=int(row["n"]),
                leased=int(leased["n"]),
                oldest_wait_s=max(0.0, now - float(oldest)) if oldest is not None else 0.0,
                active_jobs=int(active["n"]),
            )

        return self._transaction(run, write=False)

    # -- retention ----------------------------------------------------------------------------------
    def take_lease(self, name: str, holder: str, lease_s: float) -> bool:
        return self._transaction(lambda tx: retention.take_lease(tx, name, holder, lease_s))

    def drop_lease(self, name: str, holder: str) -> None:
        self._transaction(lambda tx: retention.drop_lease(tx, name, holder))

    def lease_holder(self, name: str) -> str:
        return self._transaction(lambda tx: retention.lease_holder(tx, name), write=False)

    def stamp_output_expiry(self, ttl_s: float) -> int:
        return self._transaction(lambda tx: retention.stamp_output_expiry(tx, ttl_s))

    def expired_outputs(self, limit: int = 100) -> list[tuple[str, str]]:
        return self._transaction(lambda tx: retention.expired_outputs(tx, limit), write=False)

    def mark_output_purged(self, job_id: str) -> bool:
        return self._transaction(
            lambda tx: self._update_job(tx, job_id, only_if="output_purge_time = 0", output_purge_time=tx.now())
        )

    def unpurged_job_files(self, older_than_s: float, limit: int = 100) -> list[str]:
        return self._transaction(lambda tx: retention.unpurged_job_files(tx, older_than_s, limit), write=False)

    def mark_files_purged(self, job_ids: Sequence[str]) -> int:
        return self._transaction(lambda tx: retention.mark_files_purged(tx, job_ids)) if job_ids else 0

    # -- webhook deliveries -------------------------------------------------------------------------
    def claim_delivery(self, lease_s: float) -> Delivery | None:
        lock = f"{self.row_lock} SKIP LOCKED" if self.row_lock else ""
        return self._transaction(lambda tx: claim_delivery(tx, lease_s, lock))

    def finish_delivery(
        self, delivery: Delivery, status: int, error: str, delivered: bool, retry_after_s: float | None
    ) -> bool:
        return self._transaction(lambda tx: finish_delivery(tx, delivery, status, error, delivered, retry_after_s))

    def get_delivery(self, job_id: str) -> Delivery | None:
        row = self._transaction(lambda tx: tx.one("SELECT * FROM webhooks WHERE job_id = ?", (job_id,)), write=False)
        return delivery_from_row(row) if row is not None else None

    # -- avatars ------------------------------------------------------------------------------------
    _LIVE = "deleted_time = 0"
    # An avatar is in use while a QUEUED or RUNNING job or a live session uses it; takes two parameters (now, now).
    _UNUSED = (
        f"NOT EXISTS (SELECT 1 FROM jobs j WHERE j.avatar_id = a.id AND j.{ACTIVE}) "
        f"AND NOT EXISTS (SELECT 1 FROM live_sessions s WHERE s.avatar_id = a.id AND {alive('s.')})"
    )

    def _live_avatar(self, tx: Tx, avatar_id: str, tenant: str | None, lock: str = "") -> AvatarRecord:
        mine = "" if tenant is None else " AND tenant = ?"
        params = (avatar_id,) if tenant is None else (avatar_id, tenant)
        row = tx.one(f"SELECT * FROM avatars WHERE id = ? AND {self._LIVE}{mine}{lock}", params)
        if row is None:
            raise NotFound(f"avatar {avatar_id!r} does not exist; create it with CreateAvatar")
        return avatar_from_row(row)

    def put_avatar(self, avatar: AvatarRecord, request: RequestKey | None = None) -> AvatarRecord:
        values = avatar_to_row(avatar)

        def run(tx: Tx) -> AvatarRecord:
            if request is not None:  # first, as in create_job
                earlier = claim_request(tx, avatar.tenant, RequestKind.AVATAR, request, avatar.id)
                if earlier is not None:
                    return self._live_avatar(tx, earlier, avatar.tenant)
            # No conflict target: a repeated id and the tenant's live content index both do nothing.
            tx.execute(
                f"INSERT INTO avatars ({', '.join(values)}) VALUES ({', '.join('?' * len(values))}) ON CONFLICT DO NOTHING",
                list(values.values()),
            )
            stored = None
            if avatar.content_hash:
                stored = self._find_avatar(tx, avatar.tenant, avatar.content_hash)
            if stored is None:
                stored = avatar_from_row(tx.only("SELECT * FROM avatars WHERE id = ?", (avatar.id,)))
            if request is not None and stored.id != avatar.id:  # the tenant's avatar of the same bytes
                retarget_request(tx, avatar.tenant, RequestKind.AVATAR, request.request_id, stored.id)
            return stored

        return self._transaction(run)

    def _find_avatar(self, tx: Tx, tenant: str, content_hash: str) -> AvatarRecord | None:
        row = tx.one(
            f"SELECT * FROM avatars WHERE tenant = ? AND content_hash = ? AND {self._LIVE}", (tenant, content_hash)
        )
        return avatar_from_row(row) if row is not None else None

    def get_avatar(self, avatar_id: str, tenant: str | None = None) -> AvatarRecord:
        return self._transaction(lambda tx: self._live_avatar(tx, avatar_id, tenant), write=False)

    def find_avatar(self, tenant: str, content_hash: str) -> AvatarRecord | None:
        return (
            self._transaction(lambda tx: self._find_avatar(tx, tenant, content_hash), write=False)
            if content_hash
            else None
        )

    def list_avatars(
        self, limit: int = 1000, tenant: str | None = None, after: PageCursor | None = None, model: str = ""
    ) -> list[AvatarRecord | UnreadableRecord]:
        mine = ("" if tenant is None else " AND tenant = ?") + (" AND model = ?" if model else "")
        page, cursor = _after(after)
        params = (*(() if tenant is None else (tenant,)), *((model,) if model else ()), *cursor, int(limit))
        rows = self._transaction(
            lambda tx: tx.query(f"SELECT * FROM avatars WHERE {self._LIVE}{mine}{page}{_NEWEST_FIRST}", params),
            write=False,
        )
        return [listed(row, avatar_from_row) for row in rows]

    def delete_avatar(self, avatar_id: str, tenant: str | None = None) -> None:
        mine = "" if tenant is None else " AND tenant = ?"
        params: tuple = (avatar_id,) if tenant is None else (avatar_id, tenant)

        def run(tx: Tx) -> int:
            deleted = tx.execute(
                f"UPDATE avatars SET deleted_time = ? WHERE id = ? AND {self._LIVE}{mine}", (tx.now(), *params)
            )
            if deleted:
                forget_requests(tx, RequestKind.AVATAR, avatar_id)
            return deleted

        if not self._transaction(run):
            raise NotFound(f"avatar {avatar_id!r} does not exist")

    def purgeable_avatars(self, limit: int = 100, avatar_id: str | None = None) -> list[str]:
        one = "" if avatar_id is None else " AND a.id = ?"
        first = () if avatar_id is None else (avatar_id,)
        rows = self._transaction(
            lambda tx: tx.query(
                f"SELECT a.id FROM avatars a WHERE a.deleted_time > 0{one} AND {self._UNUSED} ORDER BY a.deleted_time, a.id LIMIT ?",
                (*first, tx.now(), tx.now(), int(limit)),
            ),
            write=False,
        )
        return [row["id"] for row in rows]

    def known_avatars(self, avatar_ids: Sequence[str]) -> set[str]:
        return {row["id"] for row in self._rows_of("SELECT id FROM avatars", avatar_ids)}

    def _rows_of(self, select: str, ids: Sequence[str]) -> list[Any]:
        """`select` (a query without a WHERE) for the rows whose id is one of `ids`, 500 ids a query."""

        def run(tx: Tx) -> list[Any]:
            rows: list[Any] = []
            for i in range(0, len(ids), 500):
                chunk = list(ids[i : i + 500])
                rows.extend(tx.query(f"{select} WHERE id IN ({', '.join('?' * len(chunk))})", chunk))
            return rows

        return self._transaction(run, write=False) if ids else []

    def forget_avatar(self, avatar_id: str) -> bool:
        unused = self._UNUSED.replace("a.id", "avatars.id")  # DELETE takes no alias on SQLite
        return bool(
            self._transaction(
                lambda tx: tx.execute(
                    f"DELETE FROM avatars WHERE id = ? AND deleted_time > 0 AND {unused}",
                    (avatar_id, tx.now(), tx.now()),
                )
            )
        )
