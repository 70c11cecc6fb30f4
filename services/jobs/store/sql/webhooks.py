"""The webhook outbox, over a `Tx`: one row per ended job with a callback_url, written by the
transaction that ended it, so a process killed at any moment loses no webhook.

A gateway claims a due row with a lease (a token and an expiry, like a task's), posts it, and records
the attempt under that token; a gateway that dies mid-post leaves a lease that expires, and another
(or the same, restarted) claims the row again: at least once, deduplicated by the row's id. On
PostgreSQL claims skip rows another transaction holds (SKIP LOCKED); SQLite's transactions run one
at a time.
"""

from __future__ import annotations

import uuid

from services.jobs.store.jobs import Delivery, DeliveryState
from services.jobs.store.sql.tx import Row, Tx

PENDING = f"'{DeliveryState.PENDING.value}'"


def enqueue_delivery(tx: Tx, job_id: str) -> None:
    """The job's outbox row, if it has a callback_url (in the transaction that ended it)."""
    now = tx.now()
    tx.execute(
        "INSERT INTO webhooks (id, job_id, tenant, url, state, create_time, not_before) "
        f"SELECT ?, id, tenant, callback_url, {PENDING}, ?, ? FROM jobs WHERE id = ? AND callback_url <> '' "
        "ON CONFLICT DO NOTHING",
        (uuid.uuid4().hex, now, now, job_id),
    )


def delivery_from_row(row: Row) -> Delivery:
    return Delivery(
        id=row["id"],
        job_id=row["job_id"],
        tenant=row["tenant"],
        url=row["url"],
        state=DeliveryState(row["state"]),
        attempts=int(row["attempts"]),
        last_status=int(row["last_status"]),
        last_error=row["last_error"],
        create_time=float(row["create_time"]),
        not_before=float(row["not_before"]),
        delivered_time=float(row["delivered_time"]),
        token=row["token"],
    )


def claim_delivery(tx: Tx, lease_s: float, lock: str) -> Delivery | None:
    """The oldest due PENDING row with no live lease, leased to a new token (`lock`: the dialect's
    row lock that skips rows others hold, or "")."""
    now = tx.now()
    row = tx.one(
        f"SELECT id FROM webhooks WHERE state = {PENDING} AND not_before <= ? AND lease_expires <= ? "
        f"ORDER BY not_before, id LIMIT 1{lock}",
        (now, now),
    )
    if row is None:
        return None
    tx.execute(
        "UPDATE webhooks SET token = ?, lease_expires = ?, attempts = attempts + 1 WHERE id = ?",
        (uuid.uuid4().hex, now + lease_s, row["id"]),
    )
    return delivery_from_row(tx.only("SELECT * FROM webhooks WHERE id = ?", (row["id"],)))


def finish_delivery(
    tx: Tx, delivery: Delivery, status: int, error: str, delivered: bool, retry_after_s: float | None
) -> bool:
    """Record the attempt of the claim holding `delivery.token`; False when its lease was lost."""
    now = tx.now()
    if delivered:
        state, not_before, delivered_time = DeliveryState.DELIVERED, now, now
    elif retry_after_s is None:
        state, not_before, delivered_time = DeliveryState.GAVE_UP, now, 0.0
    else:
        state, not_before, delivered_time = DeliveryState.PENDING, now + max(0.0, retry_after_s), 0.0
    return (
        tx.execute(
            "UPDATE webhooks SET state = ?, last_status = ?, last_error = ?, not_before = ?, delivered_time = ?, "
            f"token = '', lease_expires = 0 WHERE id = ? AND token = ? AND state = {PENDING}",
            (state.value, int(status), error[:2000], not_before, delivered_time, delivery.id, delivery.token),
        )
        > 0
    )
