"""The rules of a job's life, apart from the SQL that applies them: which states count as active or
terminal, when a claimed task became claimable, when a task is out of attempts, and the texts a
caller reads when a rule says no. Pure decisions and constants; no transaction in here.
"""

from __future__ import annotations

import dataclasses

import grpc

from services.jobs.store.jobs import TERMINAL_STATES, JobState, TaskKind, TaskState
from services.jobs.store.sql.tx import Row

ABORTED = grpc.StatusCode.ABORTED.value[0]
CANCELLED = grpc.StatusCode.CANCELLED.value[0]

#: SQL conditions on a job row's state
ACTIVE = f"state IN ({int(JobState.QUEUED)}, {int(JobState.RUNNING)})"
NOT_TERMINAL = f"state NOT IN ({', '.join(str(int(s)) for s in sorted(TERMINAL_STATES))})"
#: the task states, and the join's kind, as SQL literals
WAITING, LEASED, BLOCKED, DONE = (
    f"'{s.value}'" for s in (TaskState.WAITING, TaskState.LEASED, TaskState.BLOCKED, TaskState.DONE)
)
JOIN = f"'{TaskKind.JOIN.value}'"


@dataclasses.dataclass(frozen=True)
class Exhausted:
    """A claim found a task out of attempts: its job must fail before the claim goes on."""

    job_id: str
    kind: TaskKind
    index: int
    attempts: int


def out_of_attempts(attempts: int, max_attempts: int) -> bool:
    """Whether a task claimed `attempts` times may not be claimed again (0 = no limit)."""
    return 0 < max_attempts <= attempts


def claimable_since(row: Row) -> float:
    """When the claimed task (a `fair_claim.claim_select` row) became claimable: an expired lease
    when it expired, else when it was made ready or, after a retryable failure, its not-before time."""
    return float(
        row["lease_expires"] if row["state"] == TaskState.LEASED.value else max(row["ready_time"], row["not_before"])
    )


def failing_for_s(row: Row, now: float) -> float:
    """How long the claimed task has kept failing retryably (0 when it has not failed)."""
    return max(0.0, now - float(row["failing_since"])) if row["failures"] else 0.0


def task_name(job_id: str, kind: TaskKind, index: int) -> str:
    if kind is TaskKind.JOIN:
        return f"the join of job {job_id}"
    if kind is TaskKind.AUDIO:
        return f"the audio track of job {job_id}"
    return f"segment {index} of job {job_id}"


def job_stage_at_claim(kind: TaskKind) -> str:
    """The job's stage once a task of `kind` is claimed first."""
    return "join" if kind is TaskKind.JOIN else "render"


def exhausted_message(job_id: str, kind: TaskKind, index: int, attempts: int) -> str:
    return (
        f"{task_name(job_id, kind, index)} was started {attempts} times and never finished: each time its "
        "render worker stopped renewing the lease (crashed, was evicted or lost the database) or gave it "
        "back after an error; see the render workers' logs"
    )


def too_many_message(active: int, limit: int, owner: str | None = None) -> str:
    who = f"client {owner!r} has" if owner is not None else "the service has"
    scope = " for one client" if owner is not None else ""
    return f"{who} {active} jobs queued or running (limit {limit}{scope}); retry later"


CANCELLED_MESSAGE = "the job was cancelled"
