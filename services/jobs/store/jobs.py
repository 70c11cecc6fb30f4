"""The job store: one small interface, two implementations (SQLite, PostgreSQL) that pass the same tests.

Why a store and not memory: a gateway restart or rollout must lose nothing, any gateway replica must
answer for any job, and render workers on many pods must share out the work. The store holds:

- **jobs**: state, stage, progress, error, options, models, stage_seconds, the output's blob key;
  `version` grows by one on every change (WatchJob follows it).
- **tasks**: the units of work of a job, each of a kind (`TaskKind`): its audio task (when asked
  for: the AAC track), its segments (a frame range each) and one join, which becomes claimable when
  every other task of the job is done. A task is
  claimed atomically with a lease (worker, expiry) that its worker renews; a lease that expires
  (the worker died) makes the task claimable again; after `max_attempts` claims the job fails.
- **avatars**: the summary of each avatar (what Get/ListAvatars answer); its data lives in the blob store.
  A deleted avatar is only marked (`deleted_time`): it is gone for its tenant at once, but its row and
  blobs stay until no QUEUED or RUNNING job and no live session uses it (the gateway's janitor
  then purges them).
- **live sessions and live workers** (services.jobs.store.sessions): which worker holds each session.
- **request ids** of idempotent creates: (tenant, kind, request id) -> the job or avatar the first
  request made and a digest of that request, so a retry finds it again (`RequestKey`). The row is
  the unique key: of concurrent duplicates, one inserts it and makes the object; the others find it.
- **labels** of jobs and avatars (ListJobs filters on a job's), and **shared keys** (random
  secrets every gateway replica reads alike, e.g. the page tokens' HMAC key).

Every avatar and job belongs to a tenant (services.serving.tenants). The gateway's methods take the
caller's tenant and find only that tenant's rows (NotFound otherwise, as for an id that never
existed); `tenant=None` means any tenant, for the render workers, which work for every tenant.

Every method is synchronous and safe to call from several threads; asyncio callers use
`asyncio.to_thread`. Waiting for a job's change is the one async part: `ChangeFeed`.
Times are Unix seconds (float); the store's clock decides lease expiry (the database's own clock on
PostgreSQL, so workers on hosts with skewed clocks agree).

This module is the interface and imports no implementation; `open_job_store(url)` is in the
package's `__init__`.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Mapping, Sequence

from services.jobs.store.sessions import SessionStore
from services.serving.stages import DEFAULT_TIER
from services.serving.tenants import IMPLICIT_TENANT


class JobState(enum.IntEnum):
    """The same numbers as lipline.v1.JobState (the store does not import the protos)."""

    QUEUED = 1
    RUNNING = 2
    SUCCEEDED = 3
    FAILED = 4
    CANCELLED = 5


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class TaskState(str, enum.Enum):
    BLOCKED = "blocked"  # the join, until every segment is done
    WAITING = "waiting"  # claimable
    LEASED = "leased"  # a worker holds it until lease_expires (then claimable again)
    DONE = "done"


class TaskKind(str, enum.Enum):
    """What a task does: what the worker runs is decided by this, never by the task's index."""

    AUDIO = "audio"  # encode the job's AAC track from its upload (beside the segments)
    SEGMENT = "segment"  # render a frame range into an MP4 segment
    JOIN = "join"  # stream-copy the segments and the AAC track into the output


class RequestKind(str, enum.Enum):
    """What a request id created: ids are per tenant and per kind."""

    JOB = "job"
    AVATAR = "avatar"


def request_reused_message(kind: RequestKind, request_id: str) -> str:
    """INVALID_ARGUMENT's text for a request id sent again with another request."""
    what = "audio, avatar, options or labels" if kind is RequestKind.JOB else "bytes, name, photo_fps, labels or model"
    return (
        f"request_id {request_id} was already used for a different {kind.value} request (other {what}); "
        "a retry must repeat the request exactly, and a new request needs a new request_id"
    )


@dataclasses.dataclass(frozen=True)
class RequestKey:
    """A create's idempotency key: the client's request id, a digest of its canonical request (the
    same id with another request is refused), and how long a repeat finds the first's result."""

    request_id: str
    digest: str
    window_s: float


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    """A request id as the store keeps it: what it made (`target_id`) and when."""

    kind: RequestKind
    request_id: str
    digest: str
    target_id: str
    create_time: float


@dataclasses.dataclass(frozen=True)
class PageCursor:
    """The last row of a page: the next page starts after it in newest-first (create_time, id) order.
    A keyset, not an offset, so rows inserted while a client pages never shift what comes next."""

    create_time: float
    id: str


@dataclasses.dataclass(frozen=True)
class JobFilter:
    """ListJobs' filters; every one that is set must hold."""

    states: frozenset[JobState] = frozenset()  # any of these (all when empty)
    created_after: float | None = None  # create_time >= this
    created_before: float | None = None  # create_time < this
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # every one of these pairs


@dataclasses.dataclass(frozen=True)
class NewJob:
    """What SubmitJob knows when it creates a job."""

    id: str
    avatar_id: str
    owner: str  # the client ("tenant:<tenant>" with API keys, else its x-api-key or IP): per-client limits
    options: bytes  # a serialized lipline.v1.JobOptions
    audio_seconds: float
    fps: float
    total_frames: int
    segments: Sequence[tuple[int, int]]  # [start, end) frame ranges, consecutive, covering total_frames
    stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    trace_context: str = ""  # the submitting request's trace context (JSON of W3C headers), or ""
    tenant: str = IMPLICIT_TENANT  # who may see the job (services.serving.tenants)
    audio_task: bool = False  # an audio task (the AAC track) beside the segments: SubmitJob's jobs have one
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the client's, checked by the gateway
    callback_url: str = ""  # JobOptions.callback_url (checked by the gateway): a webhook once the job ends
    model: str = DEFAULT_TIER  # its avatar's generator tier (services.serving.stages.tiers)


@dataclasses.dataclass(frozen=True)
class Job:
    id: str
    avatar_id: str
    owner: str
    state: JobState
    stage: str  # "queued", "render", "join", "done", "failed", "cancelled"
    options: bytes
    audio_seconds: float
    fps: float
    total_frames: int
    frames_done: int  # frames of the segments done so far
    segments_total: int  # segments only (the audio task and the join are not segments)
    segments_done: int
    error: str
    error_code: int  # grpc.StatusCode value[0]; 0 = OK
    models: list[dict]  # [{"name", "backend", "precision"}], as the stages reported them
    stage_seconds: dict[str, float]  # summed over the job's tasks
    create_time: float
    start_time: float  # first claim; 0 = not started
    finish_time: float  # 0 = not finished
    output_key: str  # blob key of the MP4 once SUCCEEDED
    output_bytes: int
    version: int  # +1 on every change
    trace_context: str = ""  # see NewJob
    tenant: str = IMPLICIT_TENANT
    output_sha256: str = ""  # hex sha256 of the output once SUCCEEDED ('' for jobs older than the record)
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # retention (services.jobs.retention): when the output expires (0 = not stamped yet) and when the
    # janitor deleted it (0 = not yet)
    output_expire_time: float = 0.0
    output_purge_time: float = 0.0
    model: str = DEFAULT_TIER  # its avatar's generator tier, which renders it

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class DeliveryState(str, enum.Enum):
    """A webhook delivery's state (the outbox row's `state` column)."""

    PENDING = "pending"  # not delivered yet (leased while a gateway tries it)
    DELIVERED = "delivered"  # the receiver answered 2xx
    GAVE_UP = "gave_up"  # no 2xx within the retry window


@dataclasses.dataclass(frozen=True)
class Delivery:
    """A job's webhook delivery: an outbox row, written in the transaction that ended the job."""

    id: str  # the delivery id (the webhook-id header): the same on every attempt
    job_id: str
    tenant: str
    url: str
    state: DeliveryState
    attempts: int  # attempts started so far (a claim counts one)
    last_status: int  # the last attempt's HTTP status; 0 = none came
    last_error: str
    create_time: float  # when the job ended (the retry window starts here)
    not_before: float  # the next attempt's earliest start
    delivered_time: float  # 0 until DELIVERED
    token: str = ""  # the lease of the claim that holds it ("" when read, not claimed)


@dataclasses.dataclass(frozen=True)
class Task:
    """A claimed task, as its worker holds it (the lease is identified by `token`)."""

    job_id: str
    index: int  # the task's position in its job (names its blobs); what it does is `kind`
    kind: TaskKind
    start_frame: int  # [start, end) frames; the join spans the whole clip
    end_frame: int
    attempts: int  # claims so far, this one included
    token: str  # unique per claim: renew/complete/release must present it
    lease_expires: float
    ready_time: float  # when the task last became claimable (created, unblocked, released
    # or its lease expired): claim time minus this = queue wait
    failures: int = 0  # retryable failures reported by `release(..., error=...)` so far
    failing_for_s: float = 0.0  # at the claim: how long since its first such failure (0 when none)
    last_error: str = ""  # the last failure's message

    @property
    def is_join(self) -> bool:
        return self.kind is TaskKind.JOIN


@dataclasses.dataclass(frozen=True)
class AvatarRecord:
    id: str
    name: str
    fps: float
    frame_count: int
    width: int
    height: int
    faces_found: int
    create_time: float
    tenant: str = IMPLICIT_TENANT  # who may see and use it
    # services.jobs.avatars.content_hash of the upload: the same tenant's same upload is the same
    # avatar (dedup within a tenant only; "" = none, never deduplicated)
    content_hash: str = ""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    model: str = DEFAULT_TIER  # the generator tier it was prepared for (services.serving.stages.tiers)


@dataclasses.dataclass(frozen=True)
class UnreadableRecord:
    """A listed row this lipline cannot read (a state it does not know, a field that is not JSON):
    its id and place in the list, and what is wrong, so one damaged row does not fail a whole list."""

    id: str
    create_time: float
    problem: str  # the CorruptRecord message a get of this row raises


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """For metrics and autoscaling (docs/architecture.md section 5)."""

    waiting: int  # segment and join tasks claimable now (expired leases included)
    leased: int  # tasks held by a live lease
    oldest_wait_s: float  # how long the oldest claimable task has waited (0 when none)
    active_jobs: int  # QUEUED + RUNNING jobs


class JobStore(SessionStore):
    """See the module docstring (and services.jobs.store.sessions for live sessions and workers). Raises services.serving.errors.NotFound for unknown ids,
    TooLarge (RESOURCE_EXHAUSTED) when a limit is hit, and StoreUnavailable when the database cannot
    be reached (callers retry with back-off; the gRPC layer maps it to UNAVAILABLE)."""

    url: str

    # -- lifecycle --------------------------------------------------------------------------------
    @abc.abstractmethod
    def migrate(self) -> None:
        """Create or upgrade the schema (idempotent; safe when several processes start at once)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def change_feed(self) -> ChangeFeed:
        """A new feed of job changes for this process (start it on the event loop that waits on it)."""

    # -- jobs (gateway) ---------------------------------------------------------------------------
    @abc.abstractmethod
    def create_job(
        self,
        job: NewJob,
        max_active: int = 0,
        max_active_per_owner: int = 0,
        check_avatar: bool = False,
        request: RequestKey | None = None,
    ) -> Job:
        """With `request`: when the job's tenant already made a job with that request id within
        `request.window_s`, that job is returned and nothing is inserted (the caller sees another id
        than its own and drops what it prepared); InvalidRequest when that request's digest differs.
        The id is recorded in the job's transaction, first, so of concurrent duplicates exactly one
        inserts a job (the others wait for its commit, then find it). Limits are not checked for a
        repeat. Otherwise: insert the job (QUEUED), its audio task if it asks for one and its segment tasks
        (WAITING) and its join (BLOCKED) in one transaction. NoCapacity (RESOURCE_EXHAUSTED with a
        retry-after-ms hint) when `max_active` (>0) QUEUED+RUNNING jobs exist, or the owner has
        `max_active_per_owner` (>0). With `check_avatar` (the gateway), NotFound unless the job's
        avatar exists, is not deleted and belongs to the job's tenant, checked in the same
        transaction (a row lock on PostgreSQL): a DeleteAvatar at the same moment either comes
        first (NotFound here) or sees this job when it decides whether to purge the avatar's data."""

    @abc.abstractmethod
    def get_job(self, job_id: str, tenant: str | None = None) -> Job:
        """NotFound unless the job exists and belongs to `tenant` (None: any tenant, workers only)."""

    @abc.abstractmethod
    def list_jobs(
        self, tenant: str, where: JobFilter, after: PageCursor | None = None, limit: int = 50
    ) -> list[Job | UnreadableRecord]:
        """The tenant's jobs that pass `where`, newest first by (create_time, id), starting after
        `after` (a page's last job), at most `limit`; a row that cannot be read is an UnreadableRecord
        in its place."""

    @abc.abstractmethod
    def delete_job(self, job_id: str, tenant: str | None = None) -> Job:
        """Remove a terminal job's row, its labels and its request ids (a repeat of its SubmitJob then
        makes a new job); returns the job as it was. FailedPrecondition while it is QUEUED or RUNNING,
        NotFound unless it belongs to `tenant`. Its blobs are the caller's to delete (first)."""

    @abc.abstractmethod
    def find_request(self, tenant: str, kind: RequestKind, request_id: str, window_s: float) -> RequestRecord | None:
        """The tenant's request id of that kind if it was recorded within the last `window_s`."""

    @abc.abstractmethod
    def purge_requests(self, older_than_s: float) -> int:
        """Delete request ids recorded more than `older_than_s` ago (no repeat can find them any
        more); returns how many."""

    @abc.abstractmethod
    def shared_key(self, name: str) -> bytes:
        """A random 32-byte secret named `name`, made by the first caller and the same for every
        process on this store from then on (no operator configuration to keep in step)."""

    @abc.abstractmethod
    def cancel_job(self, job_id: str, tenant: str | None = None) -> Job:
        """CANCELLED (error_code CANCELLED, stage "cancelled") unless already terminal; every task of
        the job is deleted, so no worker can renew or complete it. Returns the job as it is after.
        NotFound unless the job belongs to `tenant` (None: any)."""

    @abc.abstractmethod
    def fail_job(self, job_id: str, error: str, error_code: int) -> bool:
        """FAILED with the message and code unless already terminal (then False); tasks deleted."""

    @abc.abstractmethod
    def job_versions(self, job_ids: Sequence[str]) -> dict[str, int]:
        """The `version` of each of `job_ids` that exists (absent ids left out): a render worker asks
        before it deletes a task whose job it cannot find."""

    # -- tasks (render workers) -------------------------------------------------------------------
    @abc.abstractmethod
    def claim(self, worker: str, lease_s: float, max_attempts: int, max_owner_share: float = 1.0) -> Task | None:
        """Atomically lease the next claimable task, or None: fairly (services.jobs.store.fair_claim):
        the task of the owner holding the fewest live leases, then of the job holding the fewest,
        then the oldest job's lowest index; a join first, unless its owner would hold more than
        `max_owner_share` of the live leases (owners within their share go first; 1.0 = off).
        A task is claimable when WAITING, or LEASED with an expired lease. A task that would be claimed for attempt `max_attempts + 1` instead fails
        its job ("segment 3 of job X was started 3 times and never finished: ...") and the claim
        goes on to the next. A task released with a retry delay is not claimable before its
        not-before time (other tasks are claimed meanwhile). The first claim of a job makes it
        RUNNING (start_time set). Tasks whose job row no longer exists are never claimed (see
        `purge_orphan_tasks`)."""

    @abc.abstractmethod
    def renew(self, task: Task, lease_s: float) -> bool:
        """Extend the lease; False when it is no longer this claim's (expired and re-claimed, or the
        job was cancelled or failed): the worker must stop and drop its work."""

    @abc.abstractmethod
    def complete_segment(self, task: Task, frames: int, stage_seconds: dict[str, float], models: list[dict]) -> bool:
        """Mark a segment or the audio task DONE (only with the current lease, else False), add its
        frames and stage_seconds to the job (a segment also counts in segments_done), record
        `models` if the job has none; when every task but the join is done, the join becomes
        WAITING and the job's stage "join"."""

    @abc.abstractmethod
    def complete_join(
        self,
        task: Task,
        output_key: str,
        output_bytes: int,
        stage_seconds: dict[str, float],
        output_sha256: str = "",
        output_ttl_s: float = 0.0,
    ) -> bool:
        """SUCCEEDED with the output, its size and its sha256 (hex), which DownloadOutput checks
        (only with the current lease, else False); tasks deleted. `output_ttl_s` > 0: the output
        expires that long after now (the store's clock); 0 leaves the expiry for the janitor to stamp."""

    @abc.abstractmethod
    def release(self, task: Task, count_attempt: bool = True, retry_delay_s: float = 0.0, error: str = "") -> None:
        """Give a task back (WAITING) so another worker claims it, not before `retry_delay_s` from now.
        `count_attempt` False: the claim is not held against `max_attempts` (a graceful shutdown,
        or a retryable failure, which is bounded by time instead). `error` (a failure's message)
        records the failure: the first one's time, their count and the last message come back in
        the next claim's Task (failures, failing_for_s, last_error)."""

    @abc.abstractmethod
    def purge_orphan_tasks(self) -> int:
        """Delete tasks whose job row no longer exists (a hand-deleted row, a partial restore); they
        could never run and would count as waiting forever. Returns how many."""

    @abc.abstractmethod
    def job_tasks_active(self, job_id: str) -> bool:
        """Whether any task of the job is LEASED with a live lease (tests; cancel)."""

    @abc.abstractmethod
    def queue_stats(self) -> QueueStats: ...

    # -- retention (the render workers' janitor: services.render.janitor) ------------------------
    @abc.abstractmethod
    def take_lease(self, name: str, holder: str, lease_s: float) -> bool:
        """Hold the lease `name` until `lease_s` from now (the store's clock): taken when nobody holds
        it or its holder's lease has expired, renewed when `holder` holds it; False while another
        holder's lease is live. One UPDATE-or-INSERT, so of two racing holders exactly one gets it."""

    @abc.abstractmethod
    def drop_lease(self, name: str, holder: str) -> None:
        """Give the lease up if `holder` holds it (another may take it at once)."""

    @abc.abstractmethod
    def lease_holder(self, name: str) -> str:
        """Who holds the lease `name` now ("" when nobody's lease is live)."""

    @abc.abstractmethod
    def stamp_output_expiry(self, ttl_s: float) -> int:
        """Give every SUCCEEDED job without an output expiry one: its finish time + `ttl_s` (jobs that
        succeeded before expiry existed, or whose join had no TTL). Returns how many."""

    @abc.abstractmethod
    def expired_outputs(self, limit: int = 100) -> list[tuple[str, str]]:
        """(job id, output key) of SUCCEEDED jobs whose output expired (the store's clock) and was not
        deleted yet, longest expired first, at most `limit`. Two columns, not Jobs: a row damaged
        elsewhere (services.jobs.store.sql.rows) must not stop the sweep."""

    @abc.abstractmethod
    def mark_output_purged(self, job_id: str) -> bool:
        """Record that the job's output was deleted (GetJob shows it expired); False when the job is
        gone or already marked."""

    @abc.abstractmethod
    def unpurged_job_files(self, older_than_s: float, limit: int = 100) -> list[str]:
        """Ids of jobs that ended more than `older_than_s` ago whose working files (`jobs/<id>/`)
        the janitor has not deleted yet, oldest first, at most `limit`."""

    @abc.abstractmethod
    def mark_files_purged(self, job_ids: Sequence[str]) -> int:
        """Record that those jobs' working files are deleted; returns how many rows changed."""

    # -- webhook deliveries (the gateway's delivery loop) -------------------------------------------
    @abc.abstractmethod
    def claim_delivery(self, lease_s: float) -> Delivery | None:
        """A PENDING delivery due now whose lease is free or expired, leased for `lease_s` (its
        attempts +1), or None. A delivering process that dies loses only its lease."""

    @abc.abstractmethod
    def finish_delivery(
        self, delivery: Delivery, status: int, error: str, delivered: bool, retry_after_s: float | None
    ) -> bool:
        """Record an attempt of a claimed `delivery`: DELIVERED, or PENDING again from
        `retry_after_s` on, or GAVE_UP when `retry_after_s` is None. False when the lease was lost."""

    @abc.abstractmethod
    def get_delivery(self, job_id: str) -> Delivery | None:
        """The job's delivery (None before the job has ended, or without a callback_url)."""

    # -- avatars (gateway) ------------------------------------------------------------------------
    @abc.abstractmethod
    def put_avatar(self, avatar: AvatarRecord, request: RequestKey | None = None) -> AvatarRecord:
        """Insert, and return what is stored: the existing live avatar when the tenant already has one
        with the same `content_hash` (a concurrent upload of the same bytes won; the caller drops its
        own copy), or the one with the same id. With `request`, as create_job: the avatar an earlier
        request with that id made (InvalidRequest if its digest differs), else the id is recorded
        for what this returns."""

    @abc.abstractmethod
    def get_avatar(self, avatar_id: str, tenant: str | None = None) -> AvatarRecord:
        """NotFound unless the avatar exists, is not deleted, and belongs to `tenant` (None: any)."""

    @abc.abstractmethod
    def find_avatar(self, tenant: str, content_hash: str) -> AvatarRecord | None:
        """The tenant's live avatar of that content, if any (CreateAvatar's dedup)."""

    @abc.abstractmethod
    def list_avatars(
        self, limit: int = 1000, tenant: str | None = None, after: PageCursor | None = None, model: str = ""
    ) -> list[AvatarRecord | UnreadableRecord]:
        """The live avatars of `tenant` (None: all), of generator tier `model` ("" = any), newest
        first by (create_time, id), starting after `after` (a page's last avatar), at most `limit`; a
        row that cannot be read is an UnreadableRecord in its place."""

    @abc.abstractmethod
    def delete_avatar(self, avatar_id: str, tenant: str | None = None) -> None:
        """Mark the avatar deleted: absent for get/list/find and new jobs from now on; its row and data
        stay until `purgeable_avatars` lists it; its request ids are forgotten (a repeat of its
        CreateAvatar makes a new one). NotFound when absent, deleted or another tenant's."""

    @abc.abstractmethod
    def purgeable_avatars(self, limit: int = 100, avatar_id: str | None = None) -> list[str]:
        """Ids of deleted avatars that no QUEUED or RUNNING job and no ACTIVE live session uses (only `avatar_id`, when given),
        longest deleted first: their data may go now (no new job can use a deleted avatar)."""

    @abc.abstractmethod
    def forget_avatar(self, avatar_id: str) -> bool:
        """Remove a deleted avatar's row once its data is purged (False when it is not purgeable, or
        already gone: another gateway's janitor did it)."""

    @abc.abstractmethod
    def known_avatars(self, avatar_ids: Sequence[str]) -> set[str]:
        """Those of `avatar_ids` that have a row, deleted or not, of any tenant: the janitor deletes
        the files of an avatar id that has none (a gateway that died before recording the avatar)."""


class ChangeFeed(abc.ABC):
    """Wakes async waiters when a job changes: PostgreSQL LISTEN/NOTIFY, or polling on SQLite.

    One feed per process; `wait` may be called by many coroutines at once (WatchJob streams) and
    costs nothing while they wait. After a lost database connection the feed reconnects and wakes
    every waiter (they re-read the job), so a change is never missed, only reported late.
    """

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def wait(self, job_id: str, after_version: int, timeout: float) -> None:
        """Return when job `job_id` has a version above `after_version`, or after `timeout` seconds."""

    @abc.abstractmethod
    async def close(self) -> None: ...
