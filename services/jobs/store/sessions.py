"""Live sessions and live workers in the job store: the contract the gateway and the live workers share.

Why in the job store: any gateway replica must route a Converse (or a resume) to the live worker
that holds the session, and a worker that dies must lose its sessions so that a resume lands on
another. So a session is a row (tenant, avatar, state, the resolved `lipline.v1.Session` as bytes,
the sha256 of its resume token, the worker holding its lease), and each live worker keeps a row
of its own fresh with a heartbeat (address, capacity, active sessions, draining) that the gateway
places sessions by.

- **Leases**: a worker takes a session with `lease_session` (atomic: two workers racing for it,
  one wins) and renews its leases every second or so; a lease that is not renewed expires and
  another worker may take the session (`OpenSession(resume=true)`).
- **Liveness**: an ACTIVE session ends (CLOSED) when it passes its `deadline` (the session's
  `max_session_seconds`) or when nobody has held it for its idle timeout (its worker died and no
  client resumed). The store applies both when it reads the row, so an orphaned session never
  holds its avatar (DeleteAvatar's deferred purge) or a tenant's session quota for ever.
- **Tenants**: the gateway's methods take the caller's tenant: another tenant's session is
  NotFound, as for jobs; the workers' methods are tenant-free.

Unlike the job methods, these are coroutines (each runs its transaction in a thread): their only
callers are asyncio servers, and a live worker's heartbeat or lease renewal must never block the
event loop that paces its frames. The store does not import the protos: `session` is opaque bytes.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Iterable

#: "no limit" for a deadline or an idle timeout (the SQL compares numbers; a year ~33,600 never comes)
FOREVER = 1e12


#: A live session's frame clock runs from its `create_time` on whichever live worker holds it (frame k
#: is due k / fps after it: a resume elsewhere goes on with the same numbering, a gap shows as a gap).
#: Two machines' wall clocks differ by milliseconds under NTP; a resume's `last_frame` may name a frame
#: this far past the one due now before it is refused as one the session could not have made.
CLOCK_SLACK_S = 1.0


class SessionState(enum.IntEnum):
    """The same numbers as lipline.v1.SessionState."""

    ACTIVE = 1
    CLOSED = 2
    FAILED = 3


@dataclasses.dataclass(frozen=True)
class LiveWorker:
    """A live worker as its last heartbeat described it."""

    id: str
    address: str  # host:port the gateway dials (LiveService)
    capacity: int  # sessions it may hold
    active: int  # sessions it held at its last heartbeat
    draining: bool  # SIGTERM: it takes no new session
    heartbeat_time: float  # the store's clock
    leased: int = 0  # sessions whose live lease it holds now (counted by the store)

    @property
    def room(self) -> int:
        """Sessions it may still take by both counts: its capacity less what it holds by its word or
        by its leases, whichever is more (a session placed since its last heartbeat counts already).
        What placement orders by."""
        return self.capacity - max(self.active, self.leased)

    @property
    def free_by_leases(self) -> int:
        """Its capacity less its live leases only: the store's count now, where `active` may be a
        second old (a session closed since the heartbeat still counts there). A worker with none is
        full; one with some may be asked (it refuses for itself if it is full after all)."""
        return self.capacity - self.leased


@dataclasses.dataclass(frozen=True)
class SessionRow:
    id: str
    tenant: str
    avatar_id: str
    state: SessionState
    session: bytes  # a serialized lipline.v1.Session, as the gateway resolved it (no resume token)
    resume_token_sha256: str  # hex sha256 of the resume token (the token itself is never stored)
    worker_id: str  # who holds (or last held) its lease; "" = never leased, or released
    worker_address: str  # that worker's address from its heartbeat row ("" when it has none)
    lease_expires: float  # the store's clock
    lease_live: bool  # the lease is held and has not expired (the store's clock)
    create_time: float
    deadline: float  # when it ends at the latest (its max_session_seconds); FOREVER = none
    idle_timeout_s: float  # how long it may go unheld before it ends; FOREVER = none
    end_time: float  # 0 while ACTIVE
    error: str  # why it ended, for people
    error_code: int  # google.rpc.Code; 0 = OK

    @property
    def active(self) -> bool:
        return self.state is SessionState.ACTIVE


class SessionStore(abc.ABC):
    """See the module docstring. NotFound (services.serving.errors) for an unknown session, or another
    tenant's; TooLarge when a limit is hit; StoreUnavailable when the database cannot be reached."""

    # -- live workers -------------------------------------------------------------------------------
    @abc.abstractmethod
    async def heartbeat_live_worker(
        self, worker_id: str, address: str, capacity: int, active: int, draining: bool
    ) -> None:
        """Insert or update this worker's row; its heartbeat time is now (the store's clock)."""

    @abc.abstractmethod
    async def remove_live_worker(self, worker_id: str) -> None:
        """The worker is gone (a clean exit): no gateway places a session on it any more."""

    @abc.abstractmethod
    async def live_workers(self, fresh_s: float) -> list[LiveWorker]:
        """The workers that may take a session: a heartbeat within `fresh_s` seconds, not draining;
        the most room first (then by id, so ties are placed the same way by every gateway)."""

    # -- sessions (live workers) --------------------------------------------------------------------
    @abc.abstractmethod
    async def lease_session(self, session_id: str, worker_id: str, lease_s: float) -> bool:
        """Take the session's lease for `lease_s` seconds if it is ACTIVE and unleased, its lease
        expired, or the lease is already this worker's; False otherwise (another worker holds it, or
        it ended). Atomic: of two workers racing for it, one wins."""

    @abc.abstractmethod
    async def renew_session_leases(self, worker_id: str, session_ids: Iterable[str], lease_s: float) -> set[str]:
        """Extend this worker's leases on those sessions; returns the ids still its own (the others
        ended, or another worker took them: drop them)."""

    @abc.abstractmethod
    async def release_session(self, session_id: str, worker_id: str) -> bool:
        """Give up the lease (a draining worker, or a gateway moving a session off a worker that
        answers UNAVAILABLE), only if `worker_id` holds it: another worker may take it at once."""

    @abc.abstractmethod
    async def end_session(
        self, session_id: str, worker_id: str, state: SessionState, error: str, error_code: int
    ) -> bool:
        """CLOSED or FAILED with the message and code, only if `worker_id` holds the session and it
        is ACTIVE (else False, nothing changes)."""

    @abc.abstractmethod
    async def get_session_row(self, session_id: str) -> SessionRow:
        """The session of any tenant (the workers' view); NotFound when absent."""

    # -- sessions (gateway) -------------------------------------------------------------------------
    @abc.abstractmethod
    async def create_session(
        self,
        tenant: str,
        session_id: str,
        avatar_id: str,
        session_bytes: bytes,
        resume_token_sha256: str,
        *,
        max_seconds: float = 0.0,
        idle_timeout_s: float = 0.0,
        max_per_tenant: int = 0,
    ) -> SessionRow:
        """Insert the session (ACTIVE, unleased: the worker the gateway places it on leases it).
        NotFound unless the avatar exists, is not deleted and is the tenant's, checked in the same
        transaction as the insert (a DeleteAvatar at the same moment comes first, or sees the
        session when it decides whether to purge the avatar). `max_seconds` and `idle_timeout_s`
        (0: none) set when it ends at the latest and how long it may go unheld; TooLarge when the
        tenant already has `max_per_tenant` (>0) sessions ACTIVE."""

    @abc.abstractmethod
    async def get_session(self, tenant: str, session_id: str) -> SessionRow:
        """NotFound unless the session exists and is `tenant`'s."""

    @abc.abstractmethod
    async def close_session(
        self, tenant: str, session_id: str, error: str = "closed by CloseSession", error_code: int = 0
    ) -> SessionRow:
        """CLOSED (its lease ends with it) unless it has already ended; the row as it is after.
        NotFound unless it is `tenant`'s."""

    @abc.abstractmethod
    async def delete_session(self, tenant: str, session_id: str) -> None:
        """Remove the row (CreateSession found no worker to place it on: it never existed)."""
