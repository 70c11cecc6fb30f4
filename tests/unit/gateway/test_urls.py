"""The outbound URL rules (services.gateway.urls, issue 29 item 3): one parse (yarl, what aiohttp sends
with), refusing every URL that two parsers could read differently, and allow-list entries.

Besides the cases, two properties: any text is either a URL yarl and urllib read alike (scheme, host,
port, path and query) or INVALID_ARGUMENT, never another error; and a forbidden character (backslash,
tab, CR, LF, a look-alike dot, %5C) put anywhere in a good URL makes it INVALID_ARGUMENT."""

from __future__ import annotations

import ipaddress
import urllib.parse

import pytest
import yarl
from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway.urls import MAX_URL_CHARS, allowed_hosts, check_host, host_port, parse_url, resolve_redirect
from services.serving.errors import InvalidRequest

SCHEMES = ("https", "http", "s3")
HINT = "use https://, http:// or s3://"


def parse(text: str) -> yarl.URL:
    return parse_url(text, "callback_url", SCHEMES, HINT)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        # the URL: urllib reads host 127.0.0.1:5 (listed), yarl refuses it
        ("http://127.0.0.1:6\\@127.0.0.1:5/hook", "a backslash is not allowed"),
        ("https://hooks.example.com\\.evil.com/x", "a backslash is not allowed"),
        ("https://hooks.example.com/a\\b", "a backslash is not allowed"),
        ("https://hooks.example.com/a%5Cb", "%5C (position 27) encodes a backslash"),
        ("https://hooks.example.com/a%5cb", "encodes a backslash"),
        ("https://hooks.example.com/x?a=%5C", "encodes a backslash"),
        ("http://127.0.0.1:6%5C@127.0.0.1:5/hook", "encodes a backslash"),
        ("https://hooks.example.com/a%0Ab", "encodes a control character"),
        ("https://hooks.example.com/a%00", "encodes a control character"),
        ("https://hooks.example.com/a%7f", "encodes a control character"),
        ("https://hooks.exa\tmple.com/x", "tabs and line breaks"),
        ("https://hooks.example.com/x\r\nHost: evil", "tabs and line breaks"),
        ("https://hooks.example.com/x\n", "tabs and line breaks"),
        ("\thttps://hooks.example.com/x", "tabs and line breaks"),
        ("https://hooks.example.com/\x00", "control character U+0000"),
        ("https://hooks.example.com/\x7f", "control character U+007F"),
        (" https://hooks.example.com/x", "a space is not allowed"),
        ("https://hooks.example.com/a b", "a space is not allowed"),
        ("https://user:pass@hooks.example.com/x", "user name or password"),
        ("https://hooks.example.com@evil.example.com/x", "user name or password"),
        ("https://@hooks.example.com/x", "user name or password"),
        ("http://[fe80::1%25eth0]:8080/x", "IPv6 zone id"),
        ("http://[fe80::1%eth0]/x", "does not start a %XX escape"),
        ("https://hooks\uff0eexample.com/x", "U+FF0E"),
        ("https://hooks\u3002example.com/x", "U+3002"),
        ("https://hooks\uff61example.com/x", "U+FF61"),
        ("https://hooks.example.com\uff0e/x", "is not ASCII"),
        ("https://hooks.example.com./x", "ends with '.'"),
        ("https://hooks.example.com.:443/x", "ends with '.'"),
        ("https://127.0.0.1./x", "ends with '.'"),
        ("https://hooks..example.com/x", "is not a host name"),
        ("https://.hooks.example.com/x", "is not a host name"),
        ("https://ho%6Fks.example.com/x", "percent-encoded characters are not allowed in a host"),
        ("https://hooks.example.com:+443/x", "the port '+443' is not a number"),
        ("https://hooks.example.com:0443/x", "the port '0443' is not a number"),
        ("https://hooks.example.com:/x", "the port '' is not a number"),
        ("https://hooks.example.com:99999/x", "the port '99999' is not a number"),
        ("https://hooks.example.com:0/x", "the port '0' is not a number"),
        ("https://[::1]x/", "write an IPv6 host as"),
        ("https://[::g]/", "is not an IPv6 address"),
        ("https:///x", "names no host"),
        ("https://hooks.example.com/x#frag", "a fragment"),
        ("https://hooks.example.com/%", "does not start a %XX escape"),
        ("https://hooks.example.com/%zz", "does not start a %XX escape"),
        ("https://hooks.example.com/caf\u00e9", "percent-encode anything else"),
        ("https://hooks.example.com/{x}", "must be percent-encoded (%7B)"),
        ("https://hooks.example.com/a|b", "must be percent-encoded (%7C)"),
        ('https://hooks.example.com/"', "must be percent-encoded (%22)"),
        ("ftp://hooks.example.com/x", HINT),
        ("hooks.example.com/x", HINT),
        ("https:hooks.example.com/x", HINT),
        ("//hooks.example.com/x", HINT),
        ("", HINT),
        ("https://hooks.example.com/" + "x" * MAX_URL_CHARS, "characters; the limit is 2048"),
    ],
)
def test_a_url_parsers_could_read_differently_is_invalid_argument_saying_why(text: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=None) as caught:
        parse(text)
    assert says in str(caught.value)
    assert str(caught.value).startswith("callback_url ")


@pytest.mark.parametrize(
    ("text", "host", "sent"),
    [
        ("https://hooks.example.com/x", "hooks.example.com:443", "/x"),
        ("HTTPS://Hooks.Example.COM:8443/x?y=1", "hooks.example.com:8443", "/x?y=1"),
        ("http://127.0.0.1:8080/hook", "127.0.0.1:8080", "/hook"),
        ("http://receiver.internal", "receiver.internal:80", "/"),
        ("https://xn--e1afmkfd.xn--p1ai/x", "xn--e1afmkfd.xn--p1ai:443", "/x"),
        ("https://under_score.internal/x", "under_score.internal:443", "/x"),
        ("http://[::1]:8080/x", "[::1]:8080", "/x"),
        ("http://[0:0:0:0:0:0:0:1]/x", "[::1]:80", "/x"),
        ("https://[FE80::1]/x", "[fe80::1]:443", "/x"),
        # sent byte for byte: no re-quoting, no dot-segment removal (a signed URL stays signed)
        ("https://cdn.example.com/a/../b%2Fc;v=1?X-Sig=a%2Fb%3D&e=%20", "cdn.example.com:443", None),
        ("https://cdn.example.com/caf%C3%A9.wav?", "cdn.example.com:443", "/caf%C3%A9.wav"),
        ("https://cdn.example.com/a@b/~x!$&'()*+,;=:", "cdn.example.com:443", None),
        ("https://cdn.example.com/%25%2e%2E", "cdn.example.com:443", None),
        ("s3://media-bucket/speech/a%20b.wav", "media-bucket:0", None),
    ],
)
def test_a_plain_url_is_parsed_once_and_sent_as_written(text: str, host: str, sent: str | None) -> None:
    url = parse(text)
    assert host_port(url) == host
    written = urllib.parse.urlsplit(text)
    assert url.raw_path_qs == (sent if sent is not None else written.path + ("?" + written.query) * bool(written.query))


def test_a_redirect_is_resolved_as_aiohttp_resolves_it_then_parsed_like_any_url() -> None:
    base = parse("https://media.example.com:8443/a/b.wav?x=1")
    assert resolve_redirect(base, "/c%2Fd.wav?e=%2F", "r") == "https://media.example.com:8443/c%2Fd.wav?e=%2F"
    assert resolve_redirect(base, "c.wav", "r") == "https://media.example.com:8443/a/c.wav"
    assert resolve_redirect(base, "//other.example.com/x", "r") == "https://other.example.com/x"
    assert resolve_redirect(base, "http://x.example.com/", "r") == "http://x.example.com/"
    for bad in ("/a\\@evil.com/", "/x\r\nSet-Cookie: a", "/a%5Cb", "//evil\uff0ecom/"):
        with pytest.raises(InvalidRequest, match="^r "):
            resolve_redirect(base, bad, "r")


def test_allow_list_entries_are_host_port_lowercase_ipv6_bracketed() -> None:
    assert allowed_hosts(" Media.Example.com, cdn.example.com:8443,,[::1]:8080,[0::1]") == {
        "media.example.com:443",
        "cdn.example.com:8443",
        "[::1]:8080",
        "[::1]:443",
    }
    assert allowed_hosts("receiver.internal", 80) == {"receiver.internal:80"}
    assert allowed_hosts("") == frozenset()


def test_check_host_looks_at_the_parsed_url() -> None:
    hosts = allowed_hosts("hooks.example.com,[::1]:8080")
    check_host(parse("https://HOOKS.example.com:443/x"), hosts, "callback_url", "callback_hosts", "ask")
    check_host(parse("https://[0::1]:8080/x"), hosts, "callback_url", "callback_hosts", "ask")
    with pytest.raises(InvalidRequest, match=r"host evil.example.com:443 is not on this gateway's callback_hosts"):
        check_host(parse("https://evil.example.com/x"), hosts, "callback_url", "callback_hosts", "ask")


# -- properties ---------------------------------------------------------------------------------

_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9_-]{0,8}[a-z0-9])?", fullmatch=True)
_HOST = st.one_of(
    st.lists(_LABEL, min_size=1, max_size=4).map(".".join),
    st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t))),
    st.sampled_from(["[::1]", "[2001:db8::7]", "[::ffff:10.0.0.1]"]),
)
_PCHAR = st.one_of(
    st.sampled_from(list("abcXYZ019-._~!$&'()*+,;=:@")),
    st.sampled_from(["%20", "%2F", "%2e", "%25", "%C3%A9", "%3F", "%23", "%5B"]),
)
_SEGMENT = st.lists(_PCHAR, max_size=6).map("".join)
_PATH = st.lists(_SEGMENT, max_size=4).map(lambda s: "/" + "/".join(s))
_QUERY = st.one_of(
    st.just(""), st.lists(st.one_of(_PCHAR, st.sampled_from(["/", "?"])), max_size=8).map(lambda q: "?" + "".join(q))
)


@st.composite
def good_urls(draw: st.DrawFn) -> str:
    scheme = draw(st.sampled_from(["https", "http", "HTTPS"]))
    port = draw(st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f":{p}")))
    return f"{scheme}://{draw(_HOST)}{port}{draw(_PATH)}{draw(_QUERY)}"


def urllib_host_port(text: str) -> str:
    """`host:port` of `text` as urllib reads it, written as host_port writes it."""
    parts = urllib.parse.urlsplit(text)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{ipaddress.IPv6Address(host).compressed}]"
    return f"{host}:{parts.port or {'https': 443, 'http': 80}[parts.scheme]}"


@settings(max_examples=300, deadline=None, database=None)
@given(good_urls())
def test_a_good_url_reads_alike_to_yarl_and_urllib_and_is_sent_as_written(text: str) -> None:
    url = parse(text)
    parts = urllib.parse.urlsplit(text)
    assert (url.scheme, host_port(url)) == (parts.scheme, urllib_host_port(text))
    assert url.raw_path_qs == (parts.path or "/") + ("?" + parts.query) * bool(parts.query)


_NASTY = ["\\", "\t", "\r", "\n", "\uff0e", "\u3002", "\uff61", "%5C", "%5c", "\x00", " "]


@settings(max_examples=300, deadline=None, database=None)
@given(good_urls(), st.sampled_from(_NASTY), st.data())
def test_a_forbidden_character_anywhere_is_invalid_argument(text: str, nasty: str, data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(text)))
    with pytest.raises(InvalidRequest):
        parse(text[:at] + nasty + text[at:])


_ALPHABET = list("ab1.:/?#[]@%-_~!$&'()*+,;=5Cc") + _NASTY + ["\u00e9", "::", "@x", "%25"]


@settings(max_examples=500, deadline=None, database=None)
@given(st.sampled_from(["https://", "http://", "s3://", "HTTP://", "https:", ""]), st.lists(st.sampled_from(_ALPHABET)))
def test_any_text_is_a_url_both_parsers_read_alike_or_invalid_argument(prefix: str, pieces: list[str]) -> None:
    text = prefix + "".join(pieces)
    try:
        url = parse(text)
    except InvalidRequest:
        return
    parts = urllib.parse.urlsplit(text)
    assert (url.scheme, url.raw_host and url.raw_host.lower(), url.explicit_port, url.raw_user) == (
        parts.scheme,
        parts.hostname,
        parts.port,
        None,
    )
    assert url.raw_path == (parts.path or "/") and url.raw_query_string == parts.query
