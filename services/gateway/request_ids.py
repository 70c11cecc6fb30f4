"""Idempotent creates at the API's edge: the client's request_id checked and its request digested.

A retry must be recognised as the same request, and a reused id with another request refused (it
is a client bug that would otherwise hand back an unrelated job). The store keeps a digest of the
canonical request, not the request: a sha256 over a sorted JSON of what defines the result (for a
job its avatar, the audio's sha256, the options as stored and the labels), so two encodings of one
request (a map's order, an unknown field protobuf kept) digest alike.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping

from services.jobs.store.jobs import RequestKey
from services.serving.errors import InvalidRequest

_UUID_CHARS = 36
_EXAMPLE = "123e4567-e89b-12d3-a456-426614174000"


def check_request_id(request_id: str) -> str:
    """The id in lowercase canonical form ("" when unset); InvalidRequest unless it is a UUID in
    its 36-character text form (any version: clients make them with their own libraries)."""
    if not request_id:
        return ""
    try:
        parsed = uuid.UUID(request_id) if len(request_id) == _UUID_CHARS else None
    except ValueError:
        parsed = None
    if parsed is None or str(parsed) != request_id.lower():
        raise InvalidRequest(
            f"request_id {request_id[:64]!r} is not a UUID; send one in its 36-character form, e.g. {_EXAMPLE}, "
            "the same one on every retry of a request"
        )
    return str(parsed)


def request_digest(fields: Mapping[str, object]) -> str:
    """Hex sha256 of the canonical JSON of `fields` (keys sorted, no spaces)."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def request_key(request_id: str, fields: Mapping[str, object], window_s: float) -> RequestKey | None:
    """The store's key for a checked request id (None when the request has none)."""
    return RequestKey(request_id, request_digest(fields), window_s) if request_id else None
