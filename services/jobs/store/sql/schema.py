"""The job store's tables and their migrations: what a database holds, and how an old one catches up.

A new database gets version 1's statements, then every migration, exactly like an old one; one
transaction runs them all (under an advisory lock on PostgreSQL, so two processes starting at once
do not migrate twice). A database newer than this lipline is refused, not guessed at.
"""

from __future__ import annotations

from services.jobs.store.jobs import RequestKind, TaskKind, TaskState
from services.jobs.store.sql.tx import Tx
from services.serving.stages import DEFAULT_TIER
from services.serving.tenants import IMPLICIT_TENANT

SCHEMA_VERSION = 11
# The key of the transaction-scoped advisory lock that serializes migrations (PostgreSQL); arbitrary.
MIGRATE_LOCK = 0x6C69706C696E01
_TASK_KINDS = ", ".join(f"'{k.value}'" for k in TaskKind)
_REQUEST_KINDS = ", ".join(f"'{k.value}'" for k in RequestKind)
#: stands for the dialect's binary type (BLOB or BYTEA) in a migration's statements
BLOB_TYPE = "{blob_type}"

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
    # one task model (issue 18): a task's kind is a column, not its index. Before, a job's audio task
    # was index 0 with an empty frame range (SubmitJob's jobs) and the join index -1; the audio task
    # counted in segments_total (and in segments_done once done), which now counts segments only.
    # Only jobs with task rows can be told apart (an ended job's tasks are deleted): those are fixed.
    6: [
        f"ALTER TABLE tasks ADD COLUMN kind TEXT NOT NULL DEFAULT '{TaskKind.SEGMENT.value}' CHECK (kind IN ({_TASK_KINDS}))",
        f"UPDATE tasks SET kind = '{TaskKind.JOIN.value}' WHERE idx = -1",
        f"UPDATE tasks SET kind = '{TaskKind.AUDIO.value}' WHERE idx = 0 AND start_frame = end_frame",
        "UPDATE jobs SET segments_total = segments_total - 1, segments_done = segments_done - "
        f"(SELECT count(*) FROM tasks t WHERE t.job_id = jobs.id AND t.kind = '{TaskKind.AUDIO.value}' AND t.state = '{TaskState.DONE.value}') "
        f"WHERE EXISTS (SELECT 1 FROM tasks t WHERE t.job_id = jobs.id AND t.kind = '{TaskKind.AUDIO.value}')",
    ],
    # live sessions (issue 19; services.jobs.store.sessions): each live worker's heartbeat row, and
    # each session's row (its tenant, avatar, the resolved Session, the worker holding its lease)
    7: [
        """CREATE TABLE IF NOT EXISTS live_workers (
            id TEXT PRIMARY KEY,
            address TEXT NOT NULL,
            capacity INTEGER NOT NULL,
            active INTEGER NOT NULL,
            draining INTEGER NOT NULL DEFAULT 0,
            heartbeat_time DOUBLE PRECISION NOT NULL
        )""",
        f"""CREATE TABLE IF NOT EXISTS live_sessions (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            avatar_id TEXT NOT NULL,
            state INTEGER NOT NULL,
            session {BLOB_TYPE} NOT NULL,
            resume_token_sha256 TEXT NOT NULL,
            worker_id TEXT NOT NULL DEFAULT '',
            lease_expires DOUBLE PRECISION NOT NULL,
            create_time DOUBLE PRECISION NOT NULL,
            deadline DOUBLE PRECISION NOT NULL,
            idle_timeout_s DOUBLE PRECISION NOT NULL,
            end_time DOUBLE PRECISION NOT NULL DEFAULT 0,
            error TEXT NOT NULL DEFAULT '',
            error_code INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX IF NOT EXISTS live_sessions_avatar ON live_sessions (avatar_id, state)",
        "CREATE INDEX IF NOT EXISTS live_sessions_tenant ON live_sessions (tenant, state)",
        "CREATE INDEX IF NOT EXISTS live_sessions_worker ON live_sessions (worker_id, state)",
    ],
    # an API backends build on (issue 21): labels on jobs and avatars (JSON, as given; job_labels is
    # what ListJobs' label selector searches), the request ids of idempotent creates (one row per
    # tenant, kind and id: the unique key that makes concurrent duplicates create one object), keys
    # the gateways share (the page tokens' HMAC key) and the index of the newest-first keyset pages
    8: [
        "ALTER TABLE jobs ADD COLUMN labels TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE avatars ADD COLUMN labels TEXT NOT NULL DEFAULT '{}'",
        """CREATE TABLE IF NOT EXISTS job_labels (
            job_id TEXT NOT NULL,
            label_key TEXT NOT NULL,
            label_value TEXT NOT NULL,
            PRIMARY KEY (job_id, label_key)
        )""",
        "CREATE INDEX IF NOT EXISTS job_labels_pair ON job_labels (label_key, label_value)",
        f"""CREATE TABLE IF NOT EXISTS request_ids (
            tenant TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ({_REQUEST_KINDS})),
            request_id TEXT NOT NULL,
            digest TEXT NOT NULL,
            target_id TEXT NOT NULL,
            create_time DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (tenant, kind, request_id)
        )""",
        "CREATE INDEX IF NOT EXISTS request_ids_target ON request_ids (kind, target_id)",
        "CREATE INDEX IF NOT EXISTS request_ids_time ON request_ids (create_time)",
        """CREATE TABLE IF NOT EXISTS shared_keys (
            name TEXT PRIMARY KEY,
            value TEXT NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS jobs_tenant_page ON jobs (tenant, create_time, id)",
        "CREATE INDEX IF NOT EXISTS avatars_tenant_page ON avatars (tenant, create_time, id)",
    ],
    # retention (issue 21 item 6; services.jobs.store.sql.retention): when a job's output expires (0:
    # not stamped yet, e.g. a job that succeeded before this version: the janitor stamps it from its
    # finish time), when the janitor deleted the output and the job's working files (0: not yet), and
    # the named leases that let one render worker at a time be the janitor
    9: [
        "ALTER TABLE jobs ADD COLUMN output_expire_time DOUBLE PRECISION NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN output_purge_time DOUBLE PRECISION NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN files_purge_time DOUBLE PRECISION NOT NULL DEFAULT 0",
        "CREATE INDEX IF NOT EXISTS jobs_retention ON jobs (state, output_purge_time, output_expire_time)",
        "CREATE INDEX IF NOT EXISTS jobs_files ON jobs (files_purge_time, finish_time)",
        """CREATE TABLE IF NOT EXISTS named_leases (
            name TEXT PRIMARY KEY,
            holder TEXT NOT NULL,
            expires DOUBLE PRECISION NOT NULL
        )""",
    ],
    # webhooks (issue 21 item 5; services.jobs.store.sql.webhooks): a job's callback_url (also in its
    # options, which the store does not parse) and the outbox, one delivery per ended job with one,
    # written by the transaction that ended it and leased by the gateway that posts it
    10: [
        "ALTER TABLE jobs ADD COLUMN callback_url TEXT NOT NULL DEFAULT ''",
        """CREATE TABLE IF NOT EXISTS webhooks (
            id TEXT PRIMARY KEY,
            job_id TEXT NOT NULL UNIQUE,
            tenant TEXT NOT NULL,
            url TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'gave_up')),
            attempts INTEGER NOT NULL DEFAULT 0,
            last_status INTEGER NOT NULL DEFAULT 0,
            last_error TEXT NOT NULL DEFAULT '',
            create_time DOUBLE PRECISION NOT NULL,
            not_before DOUBLE PRECISION NOT NULL,
            token TEXT NOT NULL DEFAULT '',
            lease_expires DOUBLE PRECISION NOT NULL DEFAULT 0,
            delivered_time DOUBLE PRECISION NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX IF NOT EXISTS webhooks_due ON webhooks (state, not_before)",
    ],
    # model tiers (issue 30; docs/architecture.md section 12): the generator tier an avatar was prepared
    # for, and of each job its avatar's (what renders it); every row made before is Wav2Lip's. A live
    # session's tier is in its stored Session.
    11: [
        f"ALTER TABLE avatars ADD COLUMN model TEXT NOT NULL DEFAULT '{DEFAULT_TIER}'",
        f"ALTER TABLE jobs ADD COLUMN model TEXT NOT NULL DEFAULT '{DEFAULT_TIER}'",
        "CREATE INDEX IF NOT EXISTS avatars_tenant_model ON avatars (tenant, model, create_time, id)",
    ],
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


def migration(version: int, blob_type: str) -> list[str]:
    """The statements of migration `version` for a dialect whose binary type is `blob_type`."""
    return [statement.replace(BLOB_TYPE, blob_type) for statement in MIGRATIONS[version]]


def migrate(tx: Tx, blob_type: str) -> None:
    """Create the tables if they are missing and run the migrations the database lacks (in `tx`)."""
    tx.lock(MIGRATE_LOCK)
    for statement in schema(blob_type):
        tx.execute(statement)
    row = tx.one("SELECT max(version) AS version FROM schema_version")
    recorded = int(row["version"] or 0) if row else 0
    current = max(1, recorded)  # none recorded: the tables just made are version 1
    if current > SCHEMA_VERSION:
        raise RuntimeError(
            f"the job store's schema is version {current}, newer than this lipline's ({SCHEMA_VERSION}): upgrade lipline before pointing it at this database"
        )
    for version in range(current + 1, SCHEMA_VERSION + 1):
        for statement in migration(version, blob_type):
            tx.execute(statement)
    if recorded != SCHEMA_VERSION:
        tx.execute("DELETE FROM schema_version")
        tx.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
