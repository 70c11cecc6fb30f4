"""Request ids of idempotent creates, over a `Tx`: the unique key that makes a retried create find
what the first one made.

The row is claimed first in the create's transaction (INSERT ... ON CONFLICT DO NOTHING on the
primary key (tenant, kind, request_id)). Of concurrent duplicates one inserts it; on PostgreSQL the
others' INSERT waits for that transaction and, once it commits, inserts nothing, and their next
statement (READ COMMITTED) reads the winner's row; on SQLite the transactions run one at a time.
A row older than the window is deleted before the claim, so the id is new again after it.
"""

from __future__ import annotations

from services.jobs.store.jobs import RequestKey, RequestKind, RequestRecord, request_reused_message
from services.jobs.store.sql.tx import Tx
from services.serving.errors import InvalidRequest

_KEY = "tenant = ? AND kind = ? AND request_id = ?"


def find_request(tx: Tx, tenant: str, kind: RequestKind, request_id: str, window_s: float) -> RequestRecord | None:
    row = tx.one(
        f"SELECT * FROM request_ids WHERE {_KEY} AND create_time > ?",
        (tenant, kind.value, request_id, tx.now() - window_s),
    )
    if row is None:
        return None
    return RequestRecord(kind, row["request_id"], row["digest"], row["target_id"], float(row["create_time"]))


def claim_request(tx: Tx, tenant: str, kind: RequestKind, key: RequestKey, target_id: str) -> str | None:
    """Record `key` for `target_id`, or return the id an earlier request with it made (within its
    window); InvalidRequest when that request's digest differs."""
    now = tx.now()
    params = (tenant, kind.value, key.request_id)
    tx.execute(f"DELETE FROM request_ids WHERE {_KEY} AND create_time <= ?", (*params, now - key.window_s))
    inserted = tx.execute(
        "INSERT INTO request_ids (tenant, kind, request_id, digest, target_id, create_time) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (*params, key.digest, target_id, now),
    )
    if inserted:
        return None
    row = tx.only(f"SELECT digest, target_id FROM request_ids WHERE {_KEY}", params)
    if row["digest"] != key.digest:
        raise InvalidRequest(request_reused_message(kind, key.request_id))
    return str(row["target_id"])


def retarget_request(tx: Tx, tenant: str, kind: RequestKind, request_id: str, target_id: str) -> None:
    """Point a request id recorded in this transaction at another object (the one a create found it
    duplicated, e.g. the tenant's avatar of the same bytes)."""
    tx.execute(f"UPDATE request_ids SET target_id = ? WHERE {_KEY}", (target_id, tenant, kind.value, request_id))


def forget_requests(tx: Tx, kind: RequestKind, target_id: str) -> None:
    """The object is gone: its request ids make a new one on a repeat."""
    tx.execute("DELETE FROM request_ids WHERE kind = ? AND target_id = ?", (kind.value, target_id))
