"""ListJobs' filters and a page's bounds (services.gateway.lists), without a server."""

from __future__ import annotations

import logging

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from lipline.v1 import gateway_pb2
from services.gateway.lists import _page, job_filter
from services.jobs.store.jobs import AvatarRecord, JobState, PageCursor, UnreadableRecord
from services.serving.errors import CorruptRecord, InvalidRequest


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


def avatar(record: AvatarRecord) -> gateway_pb2.Avatar:
    return gateway_pb2.Avatar(id=record.id, name="x" * 1000)


def record(i: int) -> AvatarRecord:
    return AvatarRecord(f"{i:024x}", "x", 25.0, 1, 8, 8, 1, create_time=float(i))


def test_a_page_stops_at_its_byte_budget_and_goes_on_after_its_last_row() -> None:
    rows = [record(i) for i in range(10)]
    page = _page(rows, 5, avatar, budget=1_000_000)
    assert (len(page.listed), page.after) == (5, PageCursor(4.0, f"{4:024x}"))  # a sixth row was read: there is more
    page = _page(rows[:5], 5, avatar, budget=1_000_000)
    assert (len(page.listed), page.after) == (5, None)  # the last page
    page = _page(rows, 5, avatar, budget=2_500)
    assert (len(page.listed), page.after) == (2, PageCursor(1.0, f"{1:024x}"))  # cut by bytes: row 2 comes next


def test_a_row_that_cannot_be_read_or_shown_is_listed_by_id_and_the_rest_are_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On main one damaged row failed the whole ListJobs with DATA_LOSS: the tenant saw none of its jobs."""
    damaged = UnreadableRecord("d" * 24, 3.0, "job 'ddd' has a record this lipline cannot read (state 99 ...)")

    def shown(row: AvatarRecord) -> gateway_pb2.Avatar:
        if row.id == record(1).id:
            raise CorruptRecord(f"avatar {row.id!r} has a record this lipline cannot read (its labels field)")
        return avatar(row)

    rows: list[AvatarRecord | UnreadableRecord] = [record(4), damaged, record(2), record(1), record(0)]
    with caplog.at_level(logging.WARNING, logger="services.gateway.lists"):
        page = _page(rows, 4, shown, budget=1_000_000, tenant="acme")
    assert [a.id for a in page.listed] == [record(4).id, record(2).id]
    assert page.unreadable == ["d" * 24, record(1).id]
    assert page.after == PageCursor(1.0, record(1).id)  # the page goes on after an unreadable row like any other
    assert "state 99" in caplog.text and "its labels field" in caplog.text and "'acme'" in caplog.text
