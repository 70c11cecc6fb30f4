"""One open transaction, as the shared SQL sees it: what each store's driver must provide.

The SQL is the subset SQLite and PostgreSQL both accept, with `?` placeholders (PostgreSQL's store
turns them into `%s`); rows are mappings by column name.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]


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

    def only(self, sql: str, params: Sequence[Any] = ()) -> Row:
        """The row of a query that always returns one (an aggregate, a row this transaction wrote):
        none is a bug in the query, not a state of the store."""
        row = self.one(sql, params)
        if row is None:
            raise LookupError(f"no row from {sql!r}")
        return row
