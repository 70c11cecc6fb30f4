"""The claim's choice of the next task: fair across owners, then across jobs, not first come first served.

Why: ordering claimable tasks by job creation made a short job wait for every segment of a long job
queued before it (issue 17: a 5 s job behind a 600 s one took 34 s instead of 0.4 s). Instead, each
claim picks the task whose owner holds the fewest live leases, then whose job holds the fewest, then
the oldest job and the lowest index; a job's join still goes first (it finishes a job), unless its
owner is over its share. So a job submitted while workers are busy gets the next worker that frees
up: it waits for the tasks already running, never for another job's queue. Owners that hold equal
numbers of workers take turns (round robin), and so do an owner's jobs.

`max_owner_share` (the render setting `max_tenant_share`) is the fraction of live leases one owner
may hold while another owner's task waits: a task of an owner that would hold more than that fraction
(this claim included) sorts after every task of owners within theirs, joins included. The claim stays
work-conserving: an owner over its share still gets a worker nobody else wants. 1.0 = off.

Cost: the live leases are a handful of rows (one per busy worker, found through the `tasks_state`
index) grouped once; the claimable tasks are read through the same index and sorted, as before.

`GROUP_KEY` is the one place that says what "owner" means: the jobs column fairness groups by.
"""

from __future__ import annotations

from services.jobs.store.jobs import TaskKind, TaskState

#: the jobs column whose values share the workers fairly (the submitting client today)
GROUP_KEY = "owner"

_WAITING, _LEASED = (f"'{s.value}'" for s in (TaskState.WAITING, TaskState.LEASED))

#: the claimable tasks: WAITING, or LEASED with an expired lease (its worker is gone); a task given
#: back after a retryable failure also waits for its `not_before` (the claim adds that condition)
CLAIMABLE = f"(t.state = {_WAITING} OR (t.state = {_LEASED} AND t.lease_expires <= ?))"


def claim_select(claim_lock: str = "") -> str:
    """The SELECT of the next task to claim (one row or none), with `?` placeholders for
    (now, now, now, max_owner_share): the live leases are counted first, in subqueries, because
    PostgreSQL's FOR UPDATE (`claim_lock`) cannot be combined with aggregates in the locking query."""
    return (
        "WITH live AS ("
        f"SELECT lj.{GROUP_KEY} AS grp, lt.job_id AS job_id, count(*) AS n "
        "FROM tasks lt JOIN jobs lj ON lj.id = lt.job_id "
        f"WHERE lt.state = {_LEASED} AND lt.lease_expires > ? GROUP BY lj.{GROUP_KEY}, lt.job_id), "
        "by_group AS (SELECT grp, sum(n) AS n FROM live GROUP BY grp), "
        "total AS (SELECT coalesce(sum(n), 0) AS n FROM live) "
        "SELECT t.job_id, t.idx, t.kind, t.state, t.start_frame, t.end_frame, t.attempts, t.ready_time, t.lease_expires, "
        "t.not_before, t.failing_since, t.failures, t.last_error "
        "FROM tasks t JOIN jobs j ON j.id = t.job_id "
        f"LEFT JOIN by_group g ON g.grp = j.{GROUP_KEY} "
        "LEFT JOIN live l ON l.job_id = t.job_id "
        "CROSS JOIN total "
        f"WHERE {CLAIMABLE} AND t.not_before <= ? "
        "ORDER BY CASE WHEN coalesce(g.n, 0) + 1 > ? * (total.n + 1) THEN 1 ELSE 0 END, "
        f"CASE WHEN t.kind = '{TaskKind.JOIN.value}' THEN 0 ELSE 1 END, "
        "coalesce(g.n, 0), coalesce(l.n, 0), j.create_time, t.job_id, t.idx "
        f"LIMIT 1{claim_lock}"
    )


def claim_params(now: float, max_owner_share: float) -> tuple[float, float, float, float]:
    """The parameters of `claim_select`, in order. A share of 1.0 or more never puts anyone over."""
    return (now, now, now, float(max_owner_share))
