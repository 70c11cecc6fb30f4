"""services.serving.errors: the domain errors' statuses survive the trip to a child process and back."""

from __future__ import annotations

import pickle

from services.serving import errors


def test_no_capacity_keeps_its_retry_hint_across_a_process_boundary() -> None:
    copy = pickle.loads(pickle.dumps(errors.NoCapacity("every live worker is full", 2500)))
    assert type(copy) is errors.NoCapacity and str(copy) == "every live worker is full"
    assert copy.trailing_metadata() == (("retry-after-ms", "2500"),)
