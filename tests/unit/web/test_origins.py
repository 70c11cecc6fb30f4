"""Which pages may open the live WebSocket (services/web/origins.py): Origins as browsers serialize
them, compared with the configured public origins, never with the request's Host."""

from __future__ import annotations

import pytest

from services.web.origins import hosts_of, loopback_origins, origin_allowed, origin_of, page_origins


@pytest.mark.parametrize(
    ("text", "origin"),
    [
        ("https://try.example.com", "https://try.example.com"),
        ("HTTPS://Try.Example.COM:443", "https://try.example.com"),  # a browser omits the default port
        ("http://try.example.com:80", "http://try.example.com"),
        ("http://try.example.com:8443", "http://try.example.com:8443"),
        ("https://try.example.com:80", "https://try.example.com:80"),
        ("http://[::1]:8080", "http://[::1]:8080"),
    ],
)
def test_an_origin_is_written_as_a_browser_sends_it(text: str, origin: str) -> None:
    assert origin_of(text) == origin


@pytest.mark.parametrize(
    "text",
    [
        "try.example.com",
        "ftp://try.example.com",
        "https://try.example.com/",
        "https://try.example.com/page",
        "https://user@try.example.com",
        "https://try.example.com?x=1",
        "https://try.example.com:99999",
        "null",
        "",
    ],
)
def test_anything_but_scheme_host_port_is_not_an_origin(text: str) -> None:
    with pytest.raises(ValueError, match="origin|scheme://host"):
        origin_of(text)


def test_without_public_origins_the_page_is_the_loopback_one_of_its_port() -> None:
    assert loopback_origins(8080) == {"http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080"}
    assert page_origins((), (), 8080) == loopback_origins(8080)
    assert page_origins((), ("https://app.example",), 8080) == loopback_origins(8080) | {"https://app.example"}


def test_public_origins_replace_the_loopback_ones() -> None:
    origins = page_origins(("https://Try.Example.com",), ("https://app.example",), 8080)
    assert origins == {"https://try.example.com", "https://app.example"}


@pytest.mark.parametrize(
    ("origin", "ok"),
    [
        ("https://try.example.com", True),
        ("https://try.example.com:443", True),
        ("http://try.example.com", False),  # another scheme is another origin
        ("https://try.example.com:8443", False),  # another port too
        ("https://evil.example", False),
        ("null", False),  # a sandboxed frame, a file:// page
        ("", False),  # a browser always sends Origin on a WebSocket
        ("http://127.0.0.1:8080", False),  # loopback is the default only while no public origin is set
    ],
)
def test_an_origin_is_allowed_only_when_listed(origin: str, ok: bool) -> None:
    assert origin_allowed(origin, page_origins(("https://try.example.com",), (), 8080)) is ok


def test_the_hosts_that_name_an_origin_carry_its_port_or_none_for_the_default() -> None:
    assert hosts_of({"https://try.example.com"}) == {"try.example.com", "try.example.com:443"}
    assert hosts_of(loopback_origins(8080)) == {"127.0.0.1:8080", "localhost:8080", "[::1]:8080"}
    assert hosts_of({"http://[::1]"}) == {"[::1]", "[::1]:80"}
