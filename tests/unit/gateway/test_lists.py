"""ListJobs' filters and a page's bounds (services.gateway.lists), without a server."""

from __future__ import annotations

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from lipline.v1 import gateway_pb2
from services.gateway.lists import _page, job_filter
from services.jobs.store.jobs import JobState, PageCursor
from services.serving.errors import InvalidRequest


def ts(seconds: int) -> Timestamp:
    return Timestamp(seconds=seconds)


def test_the_filters_are_read_and_checked() -> None:
    where = job_filter(
        gateway_pb2.ListJobsRequest(
            states=[gateway_pb2.JOB_STATE_FAILED, gateway_pb2.JOB_STATE_CANCELLED],
            create_after=ts(100),
            create_before=ts(200),
            label_selector="order=1",
        )
    )
    assert (where.states, where.created_after, where.created_before, dict(where.labels)) == (
        {JobState.FAILED, JobState.CANCELLED},
        100.0,
        200.0,
        {"order": "1"},
    )
    unset = job_filter(gateway_pb2.ListJobsRequest())
    assert (unset.states, unset.created_after, unset.created_before, dict(unset.labels)) == (
        frozenset(),
        None,
        None,
        {},
    )
    with pytest.raises(InvalidRequest, match="create_after .* is not before create_before"):
        job_filter(gateway_pb2.ListJobsRequest(create_after=ts(200), create_before=ts(200)))
    with pytest.raises(InvalidRequest, match="states has 9, which is not a job state; use QUEUED"):
        job_filter(gateway_pb2.ListJobsRequest(states=[9]))  # type: ignore[list-item]


def avatar(i: int) -> gateway_pb2.Avatar:
    return gateway_pb2.Avatar(id=f"{i:024x}", name="x" * 1000)


def test_a_page_stops_at_its_byte_budget_and_goes_on_after_its_last_row() -> None:
    rows = list(range(10))
    cursor = lambda i: PageCursor(float(i), str(i))  # noqa: E731
    listed, after = _page(rows, 5, avatar, cursor, budget=1_000_000)
    assert (len(listed), after) == (5, PageCursor(4.0, "4"))  # a sixth row was read: there is more
    listed, after = _page(rows[:5], 5, avatar, cursor, budget=1_000_000)
    assert (len(listed), after) == (5, None)  # the last page
    listed, after = _page(rows, 5, avatar, cursor, budget=2_500)
    assert (len(listed), after) == (2, PageCursor(1.0, "1"))  # cut by bytes: the next page starts at row 2
