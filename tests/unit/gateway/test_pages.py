"""Page sizes and page tokens (services.gateway.pages): opaque, tamper-checked, bound to the tenant
and the filters, and read by any gateway holding the same key."""

from __future__ import annotations

import pytest

from services.gateway.pages import PageTokens, page_size
from services.jobs.store.jobs import PageCursor
from services.serving.errors import InvalidRequest

KEY = bytes(range(32))
QUERY = {"list": "jobs", "labels": [["order", "1"]]}
LAST = PageCursor(1764681234.123456789, "0123456789abcdef0123")


def test_page_size_defaults_to_50_and_is_capped_at_1000() -> None:
    assert (page_size(0), page_size(7), page_size(1000), page_size(10**9)) == (50, 7, 1000, 1000)


def test_a_token_round_trips_exactly_on_another_gateway_with_the_key() -> None:
    token = PageTokens(KEY).issue("acme", QUERY, LAST)
    assert PageTokens(KEY).read("acme", QUERY, token) == LAST  # the float too: ties compare exactly
    assert PageTokens(KEY).read("acme", QUERY, "") is None


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"),  # the signature
        lambda t: "x" + t,  # the cursor
        lambda t: t.replace(".", ""),
        lambda t: "garbage",
        lambda t: t + "=" * 600,
    ],
)
def test_an_altered_token_is_refused(change) -> None:  # type: ignore[no-untyped-def]
    token = PageTokens(KEY).issue("acme", QUERY, LAST)
    with pytest.raises(InvalidRequest, match="page_token is not one this API issued"):
        PageTokens(KEY).read("acme", QUERY, change(token))


def test_a_token_is_bound_to_its_tenant_filters_and_key() -> None:
    token = PageTokens(KEY).issue("acme", QUERY, LAST)
    for tenant, query, key in (
        ("bob", QUERY, KEY),
        ("acme", {"list": "jobs", "labels": []}, KEY),
        ("acme", QUERY, b"k" * 32),
    ):
        with pytest.raises(InvalidRequest, match="with the same filters"):
            PageTokens(key).read(tenant, query, token)
