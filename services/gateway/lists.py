"""ListJobs and ListAvatars: a request's filters and page token checked, one page read, the next
page's token issued.

Pages are newest first and keyset-based (services.gateway.pages): a page asks the store for one row
more than it shows, so the last page says so (no next_page_token) without another read. A response
also stops at half the message limit in bytes (64 labels of the longest kind make a job ~20 KB), and
the next page then starts after the last row it holds. A row this lipline cannot read (the store's
UnreadableRecord, or a stored field the proto cannot show) is listed by id in the response's
`unreadable_*_ids` and logged, instead of failing the list: the caller's other rows stay visible.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from google.protobuf.message import Message

from lipline.v1 import gateway_pb2
from services.gateway.avatars import avatar_to_proto
from services.gateway.jobs import job_to_proto
from services.gateway.labels import parse_selector
from services.gateway.pages import PageTokens, page_size
from services.gateway.tiers import check_model
from services.jobs.store.jobs import JobFilter, JobState, JobStore, PageCursor, UnreadableRecord
from services.serving.errors import CorruptRecord, InvalidRequest

log = logging.getLogger(__name__)

P = TypeVar("P", bound=Message)


def job_filter(request: gateway_pb2.ListJobsRequest) -> JobFilter:
    """The request's filters, checked: known states, a time range that is not empty, a selector."""
    states = set()
    for state in request.states:
        if state not in JobState._value2member_map_:
            known = ", ".join(f"{s.name} ({int(s)})" for s in JobState)
            raise InvalidRequest(f"states has {state}, which is not a job state; use {known}")
        states.add(JobState(state))
    after = request.create_after.ToNanoseconds() / 1e9 if request.HasField("create_after") else None
    before = request.create_before.ToNanoseconds() / 1e9 if request.HasField("create_before") else None
    if after is not None and before is not None and after >= before:
        raise InvalidRequest(
            f"create_after ({request.create_after.ToJsonString()}) is not before create_before "
            f"({request.create_before.ToJsonString()}): no job can match"
        )
    return JobFilter(frozenset(states), after, before, parse_selector(request.label_selector))


def _query(where: JobFilter) -> dict[str, object]:
    """What a page token is bound to besides the tenant: the list and its filters."""
    return {
        "list": "jobs",
        "states": sorted(int(s) for s in where.states),
        "after": where.created_after,
        "before": where.created_before,
        "labels": sorted(where.labels.items()),
    }


class Listed(Protocol):
    """A row of a list: what its page cursor is made of (read-only, as the store's frozen rows are)."""

    @property
    def id(self) -> str: ...

    @property
    def create_time(self) -> float: ...


R = TypeVar("R", bound=Listed)


@dataclasses.dataclass
class Page(Generic[P]):
    """One page: the rows shown, the ids of those that could not be read, where the next page starts."""

    listed: list[P]
    unreadable: list[str]
    after: PageCursor | None  # None on the last page


def _cursor(row: Listed) -> PageCursor:
    return PageCursor(row.create_time, row.id)


def _shown(row: R | UnreadableRecord, to_proto: Callable[[R], P]) -> P | UnreadableRecord:
    """The row's proto, or why it cannot be shown (the store could not read it, or a stored field
    is not what the proto holds)."""
    if isinstance(row, UnreadableRecord):
        return row
    try:
        return to_proto(row)
    except CorruptRecord as exc:
        return UnreadableRecord(row.id, row.create_time, str(exc))


def _page(
    rows: Sequence[R | UnreadableRecord], size: int, to_proto: Callable[[R], P], budget: int, tenant: str = ""
) -> Page[P]:
    """The protos of up to `size` of `rows` (the store read one more) within `budget` bytes, the ids
    of the unreadable ones among them, and the cursor of the next page (None on the last)."""
    page: Page[P] = Page([], [], None)
    for taken, row in enumerate(rows[:size]):
        shown = _shown(row, to_proto)
        budget -= len(shown.id) + 2 if isinstance(shown, UnreadableRecord) else shown.ByteSize() + 8  # + tag, length
        if budget < 0 and taken:
            page.after = _cursor(rows[taken - 1])
            return page
        if isinstance(shown, UnreadableRecord):
            log.warning("tenant %r lists a row it cannot read: %s", tenant, shown.problem)
            page.unreadable.append(shown.id)
        else:
            page.listed.append(shown)
    page.after = _cursor(rows[size - 1]) if len(rows) > size else None
    return page


async def list_jobs(
    jobs: JobStore,
    pages: PageTokens,
    tenant: str,
    request: gateway_pb2.ListJobsRequest,
    max_message_bytes: int,
    output_ttl_s: float = 0.0,
) -> gateway_pb2.ListJobsResponse:
    where = job_filter(request)
    query = _query(where)
    after = pages.read(tenant, query, request.page_token)
    size = page_size(request.page_size)
    rows = await asyncio.to_thread(jobs.list_jobs, tenant, where, after, size + 1)
    page = _page(rows, size, lambda j: job_to_proto(j, output_ttl_s=output_ttl_s), max_message_bytes // 2, tenant)
    token = pages.issue(tenant, query, page.after) if page.after else ""
    return gateway_pb2.ListJobsResponse(jobs=page.listed, next_page_token=token, unreadable_job_ids=page.unreadable)


async def list_avatars(
    jobs: JobStore, pages: PageTokens, tenant: str, request: gateway_pb2.ListAvatarsRequest, max_message_bytes: int
) -> gateway_pb2.ListAvatarsResponse:
    model = check_model(request.model, "model filter") if request.model else ""
    query: dict[str, object] = {"list": "avatars"}
    if model:  # a filter binds the token; without one, tokens stay as they were
        query["model"] = model
    after = pages.read(tenant, query, request.page_token)
    size = page_size(request.page_size)
    rows = await asyncio.to_thread(jobs.list_avatars, size + 1, tenant, after, model)
    page = _page(rows, size, avatar_to_proto, max_message_bytes // 2, tenant)
    token = pages.issue(tenant, query, page.after) if page.after else ""
    return gateway_pb2.ListAvatarsResponse(
        avatars=page.listed, next_page_token=token, unreadable_avatar_ids=page.unreadable
    )
