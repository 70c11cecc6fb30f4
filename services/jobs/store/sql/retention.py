"""Retention over a `Tx` (issue 21 item 6): named leases, and the rows the janitor sweeps.

Named leases are the task leases' idea without a task: a row (name, holder, expires) taken by one
UPDATE whose WHERE says "expired, or mine", else by an INSERT that a live row's primary key refuses.
PostgreSQL re-checks the UPDATE's WHERE on a row a racing transaction just changed (READ COMMITTED),
and SQLite's writers run one at a time, so of two racing holders exactly one gets the lease.

The sweeps read what is due on the store's clock (the database's on PostgreSQL), as leases do.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.jobs.store.jobs import TERMINAL_STATES, JobState
from services.jobs.store.sql.tx import Tx

_SUCCEEDED = int(JobState.SUCCEEDED)
_TERMINAL = ", ".join(str(int(s)) for s in sorted(TERMINAL_STATES))
_CHUNK = 500  # ids per IN (...) list


def take_lease(tx: Tx, name: str, holder: str, lease_s: float) -> bool:
    now = tx.now()
    expires = now + float(lease_s)
    if tx.execute(
        "UPDATE named_leases SET holder = ?, expires = ? WHERE name = ? AND (holder = ? OR expires <= ?)",
        (holder, expires, name, holder, now),
    ):
        return True
    return (
        tx.execute(
            "INSERT INTO named_leases (name, holder, expires) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            (name, holder, expires),
        )
        > 0
    )


def drop_lease(tx: Tx, name: str, holder: str) -> None:
    tx.execute("DELETE FROM named_leases WHERE name = ? AND holder = ?", (name, holder))


def lease_holder(tx: Tx, name: str) -> str:
    row = tx.one("SELECT holder FROM named_leases WHERE name = ? AND expires > ?", (name, tx.now()))
    return str(row["holder"]) if row is not None else ""


def stamp_output_expiry(tx: Tx, ttl_s: float) -> int:
    return tx.execute(
        "UPDATE jobs SET output_expire_time = finish_time + ?, version = version + 1 "
        f"WHERE state = {_SUCCEEDED} AND output_expire_time = 0 AND output_purge_time = 0",
        (float(ttl_s),),
    )


def expired_outputs(tx: Tx, limit: int) -> list[tuple[str, str]]:
    rows = tx.query(
        f"SELECT id, output_key FROM jobs WHERE state = {_SUCCEEDED} AND output_purge_time = 0 AND output_expire_time > 0 "
        "AND output_expire_time <= ? ORDER BY output_expire_time, id LIMIT ?",
        (tx.now(), int(limit)),
    )
    return [(str(row["id"]), str(row["output_key"])) for row in rows]


def unpurged_job_files(tx: Tx, older_than_s: float, limit: int) -> list[str]:
    rows = tx.query(
        f"SELECT id FROM jobs WHERE files_purge_time = 0 AND state IN ({_TERMINAL}) AND finish_time > 0 "
        "AND finish_time <= ? ORDER BY finish_time, id LIMIT ?",
        (tx.now() - float(older_than_s), int(limit)),
    )
    return [row["id"] for row in rows]


def mark_files_purged(tx: Tx, job_ids: Sequence[str]) -> int:
    changed = 0
    now = tx.now()
    for i in range(0, len(job_ids), _CHUNK):
        chunk = list(job_ids[i : i + _CHUNK])
        marks = ", ".join("?" * len(chunk))
        changed += tx.execute(
            f"UPDATE jobs SET files_purge_time = ? WHERE files_purge_time = 0 AND id IN ({marks})", (now, *chunk)
        )
    return changed
