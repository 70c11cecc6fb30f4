"""The webhook outbox in the job store (issue 21 item 5): a delivery row exactly when a job with a
callback_url ends (and in that transaction), leases that expire, attempts recorded only by the lease
holder, back-off, giving up, and DeleteJob taking the row along.

Each test runs on SQLite and on a real PostgreSQL (conftest.py).
"""

from __future__ import annotations

import time

import pytest

from services.jobs.store.jobs import DeliveryState, JobState, JobStore, NewJob
from services.serving.errors import NotFound

URL = "https://hooks.example.com/lipline"


def job(job_id: str, url: str = URL, tenant: str = "acme") -> NewJob:
    return NewJob(job_id, "a" * 24, f"tenant:{tenant}", b"", 0.8, 25.0, 20, [(0, 20)], tenant=tenant, callback_url=url)


def test_a_delivery_is_written_when_the_job_ends_and_only_with_a_callback_url(job_store: JobStore) -> None:
    job_store.create_job(job("j1"))
    job_store.create_job(job("j2", url=""))
    assert job_store.get_delivery("j1") is None and job_store.claim_delivery(5.0) is None  # not ended yet
    job_store.cancel_job("j1")
    job_store.fail_job("j2", "broken", 13)
    delivery = job_store.get_delivery("j1")
    assert delivery is not None and delivery.state is DeliveryState.PENDING and delivery.attempts == 0
    assert (delivery.url, delivery.tenant) == (URL, "acme")
    assert job_store.get_delivery("j2") is None
    job_store.cancel_job("j1")  # ending it again (already terminal) writes no second delivery
    assert job_store.get_delivery("j1") == delivery


def test_a_lease_holds_a_delivery_until_it_expires_and_a_lost_lease_records_nothing(job_store: JobStore) -> None:
    job_store.create_job(job("j1"))
    job_store.cancel_job("j1")
    first = job_store.claim_delivery(0.3)
    assert first is not None and first.attempts == 1 and first.token
    assert job_store.claim_delivery(5.0) is None  # leased: nobody else gets it
    time.sleep(0.4)  # the holder died: its lease runs out
    second = job_store.claim_delivery(5.0)
    assert second is not None and second.id == first.id and second.attempts == 2 and second.token != first.token
    assert not job_store.finish_delivery(first, 200, "", True, None)  # the dead holder's late answer
    assert job_store.finish_delivery(second, 200, "", True, None)
    done = job_store.get_delivery("j1")
    assert done is not None and done.state is DeliveryState.DELIVERED and done.delivered_time > 0
    assert (done.attempts, done.last_status, done.token) == (2, 200, "")
    assert job_store.claim_delivery(5.0) is None


def test_a_failed_attempt_waits_its_back_off_and_giving_up_is_final(job_store: JobStore) -> None:
    job_store.create_job(job("j1"))
    job_store.cancel_job("j1")
    claimed = job_store.claim_delivery(5.0)
    assert claimed is not None
    assert job_store.finish_delivery(claimed, 500, "the receiver answered HTTP 500", False, 30.0)
    waiting = job_store.get_delivery("j1")
    assert waiting is not None and waiting.state is DeliveryState.PENDING and waiting.last_status == 500
    assert waiting.not_before > time.time() + 20 and waiting.last_error.endswith("HTTP 500")
    assert job_store.claim_delivery(5.0) is None  # not due yet
    assert job_store.finish_delivery(claimed, 0, "late", False, 0.0) is False  # its lease ended with the attempt
    # Due again at once: then the retry window is over.
    job_store.create_job(job("j2"))
    job_store.cancel_job("j2")
    again = job_store.claim_delivery(5.0)
    assert again is not None and again.job_id == "j2"
    assert job_store.finish_delivery(again, 0, "no answer", False, None)
    gave_up = job_store.get_delivery("j2")
    assert gave_up is not None and gave_up.state is DeliveryState.GAVE_UP and gave_up.delivered_time == 0


def test_deleting_the_job_deletes_its_delivery(job_store: JobStore) -> None:
    job_store.create_job(job("j1"))
    job_store.cancel_job("j1")
    leased = job_store.claim_delivery(5.0)
    assert leased is not None and job_store.get_job("j1").state == JobState.CANCELLED
    job_store.delete_job("j1", "acme")
    assert job_store.get_delivery("j1") is None
    assert not job_store.finish_delivery(leased, 200, "", True, None)  # the gateway posting it records nothing
    with pytest.raises(NotFound):
        job_store.get_job("j1")
