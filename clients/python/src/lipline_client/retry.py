"""When and how long the client waits before it tries a call again.

A call is retried when its status says the same request may work later:

- RESOURCE_EXHAUSTED carrying the trailing metadata `retry-after-ms` (no room now: every live worker
  is full, the queue is full). Without the hint RESOURCE_EXHAUSTED is a limit the request itself is
  over (audio too long, an upload too large): the same request would fail again, so it is raised.
- UNAVAILABLE (the gateway restarting or draining, a store briefly unreachable, a network blip), but
  only for a call that is safe to repeat: reads, and creates that carry a request id (the server then
  answers a repeat with the first result). A create without one might have been done before the
  connection broke, so repeating it could do it twice: it is raised, for the caller to decide.

The wait doubles from `initial_backoff_s` up to `max_backoff_s`, times a random factor in [0.5, 1]
(jitter: clients cut off together do not come back together); a `retry-after-ms` hint replaces it
(times [1, 1.2]). Nothing is retried past the call's deadline.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import grpc

#: the trailing metadata key of the server's back-off hint, in milliseconds
RETRY_AFTER_HEADER = "retry-after-ms"


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently calls are retried (see the module's doc). `max_attempts=1` turns retries off."""

    max_attempts: int = 5
    initial_backoff_s: float = 0.25
    max_backoff_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not 0 <= self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError("need 0 <= initial_backoff_s <= max_backoff_s")

    def backoff_s(self, failures: int) -> float:
        """The wait after the `failures`-th failure in a row (1 for the first), with jitter."""
        return min(self.max_backoff_s, self.initial_backoff_s * 2 ** (failures - 1)) * random.uniform(0.5, 1.0)


NO_RETRY = RetryPolicy(max_attempts=1)
#: how `wait` resumes a cut WatchJob by default: 10 tries over ~15-30 s, enough for a gateway pod to
#: be replaced (a call's own retries, `RetryPolicy()`, give up after ~2-4 s)
RESUME_POLICY = RetryPolicy(max_attempts=10, initial_backoff_s=0.25, max_backoff_s=5.0)


def retry_after_s(error: grpc.RpcError) -> float | None:
    """The server's `retry-after-ms` hint of a failed call, in seconds (None when it gave none)."""
    trailers = _trailing_metadata(error)
    for key, value in trailers:
        if key == RETRY_AFTER_HEADER:
            try:
                return max(0.0, int(value) / 1000)
            except ValueError:
                return None
    return None


def retry_delay_s(error: grpc.RpcError, failures: int, policy: RetryPolicy, idempotent: bool) -> float | None:
    """How long to wait before trying again after `error` (the `failures`-th in a row), or None when
    it must not be retried (see the module's doc)."""
    if failures >= policy.max_attempts:
        return None
    code = error.code()
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        hint = retry_after_s(error)
        return None if hint is None else hint * random.uniform(1.0, 1.2)
    if code == grpc.StatusCode.UNAVAILABLE and idempotent:
        hint = retry_after_s(error)
        return policy.backoff_s(failures) if hint is None else hint * random.uniform(1.0, 1.2)
    return None


def _trailing_metadata(error: grpc.RpcError) -> Sequence[tuple[str, str]]:
    getter = getattr(error, "trailing_metadata", None)
    if getter is None:
        return ()
    try:
        return tuple(getter() or ())
    except Exception:  # noqa: BLE001 - an error without trailers (a client-side failure) has no hint
        return ()
