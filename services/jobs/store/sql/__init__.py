"""What the SQLite and PostgreSQL job stores share: the schema, the queries and the rules of a job's life.

The parts, apart as procrastinate keeps its SQL from its rules: `tx` (what a driver provides),
`schema` (tables and migrations), `rows` (rows <-> dataclasses), `rules` (pure decisions and the
texts they produce), `requests` (the request ids of idempotent creates), `store` (the JobStore
over a transaction), `feed` (the waiting half of a change feed); the claim's order is `services.jobs.store.fair_claim`.

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
A request id's row (`requests`) is claimed before everything else in create_job and put_avatar; the
deletes that forget request ids take them last, after the job's or avatar's row.

Tenants: the gateway-facing reads and changes take a `tenant` and add `AND tenant = ?`; None (the
render workers) adds nothing.
"""
