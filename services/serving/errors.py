"""Domain errors and the one table that maps them to gRPC status codes.

Handlers and model code raise these plain exceptions; the server's error interceptor turns them into
a gRPC status with the message as the details. Anything else becomes INTERNAL with a generic message
(the traceback goes to the log, never to the client).
"""

from __future__ import annotations

import grpc

#: The trailing metadata key of a back-off hint in milliseconds (RESOURCE_EXHAUSTED answers).
RETRY_AFTER_HEADER = "retry-after-ms"


class LiplineError(Exception):
    """Base class: an error whose message is safe and useful to show to the caller."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        """Metadata the status carries beside its message (a hint such as `retry-after-ms`); none by default."""
        return ()


class InvalidMedia(LiplineError):
    """Input bytes that cannot be decoded or are unusable (empty audio, corrupt image, no face)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class InvalidRequest(LiplineError):
    """A request whose fields are inconsistent or out of range."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(LiplineError):
    """An id (avatar, job) that does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class TooLarge(LiplineError):
    """Input over a configured limit (bytes, frames, seconds) or a full queue."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class NoCapacity(TooLarge):
    """Nothing has room for the request now (every live worker is full, a live session's speech queue
    is): RESOURCE_EXHAUSTED with the trailing metadata `retry-after-ms`, so a client backs off for as
    long as the server suggests."""

    def __init__(self, message: str, retry_after_ms: int = 1000) -> None:
        super().__init__(message)
        self.retry_after_ms = int(retry_after_ms)

    def __reduce__(self) -> tuple[type[NoCapacity], tuple[str, int]]:
        # an exception pickles as cls(*args): keep the hint across process boundaries
        return type(self), (str(self), self.retry_after_ms)

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((RETRY_AFTER_HEADER, str(self.retry_after_ms)),)


class PermissionDenied(LiplineError):
    """The caller may not use this object: a live session's resume token that does not match."""

    code = grpc.StatusCode.PERMISSION_DENIED


class NotReady(LiplineError):
    """The service or a stage it depends on is not available right now; retrying later may work."""

    code = grpc.StatusCode.UNAVAILABLE


class FailedPrecondition(LiplineError):
    """The object is in a state that does not allow the operation (e.g. output of an unfinished job)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class TimedOut(LiplineError):
    """Something the server waited on took longer than its limit (an audio_uri's host sending slowly)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class DataLoss(LiplineError):
    """Stored data that does not match its record (a truncated or corrupted output): retrying will not
    help; the job must be rendered again."""

    code = grpc.StatusCode.DATA_LOSS


class CheckpointError(LiplineError):
    """A weights file that does not match the architecture; the message lists missing/unexpected keys."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class StoreUnavailable(NotReady):
    """The job store or blob store cannot be reached (database restarting, network); retry later."""


class StorageFull(TooLarge):
    """The blob store has no room (ENOSPC, EDQUOT, an S3 quota): RESOURCE_EXHAUSTED, retry once
    space is freed. A TooLarge because that is the code's meaning (a resource ran out); unlike a
    too-large request, the same request may work later, so render workers retry it."""


class CorruptRecord(LiplineError):
    """A stored row or blob this lipline cannot interpret (an unknown job state, a field that is not
    JSON, a blob of the wrong size): DATA_LOSS, never retried, the message names what is wrong."""

    code = grpc.StatusCode.DATA_LOSS


#: errors a render worker retries with back-off (the stores may come back, space may be freed)
RETRYABLE_STORE_ERRORS = (StoreUnavailable, StorageFull)
