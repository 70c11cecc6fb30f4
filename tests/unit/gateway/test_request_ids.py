"""request_id checks and request digests (services.gateway.request_ids)."""

from __future__ import annotations

import pytest

from services.gateway.request_ids import check_request_id, request_digest, request_key
from services.gateway.submit import JobRequest
from services.serving.errors import InvalidRequest

RID = "5B0C3D52-8A3E-4B1F-9A37-0C6F2B7D9E11"


def test_a_uuid_is_taken_in_lowercase_and_unset_is_none() -> None:
    assert check_request_id(RID) == RID.lower()
    assert check_request_id("") == ""
    assert request_key("", {"a": 1}, 60.0) is None


@pytest.mark.parametrize(
    "bad",
    ["order-42", RID.replace("-", ""), "{" + RID[1:-1] + "}", "urn:uuid:" + RID, RID[:-1] + "g", "x" * 10_000],
)
def test_anything_but_a_36_character_uuid_is_refused(bad: str) -> None:
    with pytest.raises(InvalidRequest, match="is not a UUID; send one in its 36-character form"):
        check_request_id(bad)


def test_the_digest_is_of_the_request_not_its_encoding() -> None:
    assert request_digest({"a": 1, "labels": {"x": "1", "y": "2"}}) == request_digest(
        {"labels": {"y": "2", "x": "1"}, "a": 1}
    )
    assert request_digest({"a": 1}) != request_digest({"a": 2})


def test_a_job_requests_digest_changes_with_each_part_that_defines_the_job() -> None:
    base = JobRequest("a" * 24, b"audio", b"\x08\x01", RID.lower(), {"order": "1"})
    key = base.key(60.0)
    assert key is not None and key.window_s == 60.0 and key.request_id == RID.lower()
    others = [
        JobRequest("b" * 24, b"audio", b"\x08\x01", RID.lower(), {"order": "1"}),
        JobRequest("a" * 24, b"other audio", b"\x08\x01", RID.lower(), {"order": "1"}),
        JobRequest("a" * 24, b"audio", b"", RID.lower(), {"order": "1"}),
        JobRequest("a" * 24, b"audio", b"\x08\x01", RID.lower(), {"order": "2"}),
    ]
    digests = {key.digest} | {o.key(60.0).digest for o in others}  # type: ignore[union-attr]
    assert len(digests) == 5
    assert JobRequest("a" * 24, b"audio", b"").key(60.0) is None


def test_an_audio_uri_request_is_digested_as_sent_not_by_what_the_uri_held() -> None:
    """Issue 29 item 5: a retry whose file changed in between is the same request (AIP-155, Stripe:
    the key is the request), another URI is another request, and an upload is still its bytes."""
    uri = "https://media.example.com/speech.wav"

    def request(audio_uri: str = uri, options: bytes = b"\x08\x01") -> JobRequest:
        return JobRequest("a" * 24, b"", options, RID.lower(), {"order": "1"}, audio_uri=audio_uri)

    first = request().key(60.0)
    assert first is not None and first == request().key(60.0)
    others = [request(uri + "?v=2"), request(uri.upper()), request(""), request(options=b"")]  # "": an empty upload
    assert len({first.digest} | {o.key(60.0).digest for o in others}) == 5  # type: ignore[union-attr]
