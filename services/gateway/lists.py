"""ListJobs and ListAvatars: a request's filters and page token checked, one page read, the next
page's token issued.

Pages are newest first and keyset-based (services.gateway.pages): a page asks the store for one row
more than it shows, so the last page says so (no next_page_token) without another read. A response
also stops at half the message limit in bytes (64 labels of the longest kind make a job ~20 KB), and
the next page then starts after the last row it holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TypeVar

from google.protobuf.message import Message

from lipline.v1 import gateway_pb2
from services.gateway.avatars import avatar_to_proto
from services.gateway.jobs import job_to_proto
from services.gateway.labels import parse_selector
from services.gateway.pages import PageTokens, page_size
from services.jobs.store.jobs import JobFilter, JobState, JobStore, PageCursor
from services.serving.errors import InvalidRequest

R = TypeVar("R")
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


def _page(
    rows: Sequence[R],
    size: int,
    to_proto: Callable[[R], P],
    cursor: Callable[[R], PageCursor],
    budget: int,
) -> tuple[list[P], PageCursor | None]:
    """The protos of up to `size` of `rows` (the store read one more) within `budget` bytes, and the
    cursor of the next page (None on the last)."""
    out: list[P] = []
    for row in rows[:size]:
        message = to_proto(row)
        budget -= message.ByteSize() + 8  # + the field's tag and length
        if budget < 0 and out:
            return out, cursor(rows[len(out) - 1])
        out.append(message)
    return out, (cursor(rows[size - 1]) if len(rows) > size else None)


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
    listed, next_cursor = _page(
        rows,
        size,
        lambda j: job_to_proto(j, output_ttl_s=output_ttl_s),
        lambda j: PageCursor(j.create_time, j.id),
        max_message_bytes // 2,
    )
    token = pages.issue(tenant, query, next_cursor) if next_cursor else ""
    return gateway_pb2.ListJobsResponse(jobs=listed, next_page_token=token)


async def list_avatars(
    jobs: JobStore, pages: PageTokens, tenant: str, request: gateway_pb2.ListAvatarsRequest, max_message_bytes: int
) -> gateway_pb2.ListAvatarsResponse:
    query: dict[str, object] = {"list": "avatars"}
    after = pages.read(tenant, query, request.page_token)
    size = page_size(request.page_size)
    rows = await asyncio.to_thread(jobs.list_avatars, size + 1, tenant, after)
    listed, next_cursor = _page(
        rows, size, avatar_to_proto, lambda a: PageCursor(a.create_time, a.id), max_message_bytes // 2
    )
    token = pages.issue(tenant, query, next_cursor) if next_cursor else ""
    return gateway_pb2.ListAvatarsResponse(avatars=listed, next_page_token=token)
