"""Which pages may open the live WebSocket: those whose `Origin` is one of the page's public origins.

A browser sends `Origin` on every WebSocket and a page cannot forge it, but comparing it with the
request's `Host` proves nothing: a DNS-rebinding page (`http://evil.example:8080`, its name pointed
at this server after it loaded) sends a `Host` that matches its own Origin. So the check compares
Origin with a list the server knows independently of the request: `public_origins` (where the page
is served, as a browser shows it: an ingress's `https://try.example.com`), plus `allowed_origins`
(other pages allowed to drive sessions). With no public origin configured, the page's origins are
the loopback ones of the port the connection came to (`http://127.0.0.1:8080`, `http://localhost:8080`,
`http://[::1]:8080`): local mode's URL, or a `kubectl port-forward` to the same port
(docs/decisions.md, "The live socket trusts configured origins, not the Host header"). Where no API
key is required (local mode), the API itself answers only requests whose Host names one of the
page's own origins (`hosts_of`): the rebinding page asks under its own name.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from aiohttp import web

DEFAULT_PORTS = {"http": 80, "https": 443}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def origin_of(text: str) -> str:
    """`text` serialized as a browser sends an Origin: lowercase scheme and host, the port only when
    it is not the scheme's default. ValueError saying what is wrong when `text` is not an http(s)
    origin (a path, a query, user info, another scheme)."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        raise ValueError(f"{text!r} is not scheme://host[:port]") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"{text!r} is not an http:// or https:// origin (scheme://host[:port])")
    if parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"{text!r} is an origin: scheme://host[:port], without a path, user or trailing slash")
    host = parts.hostname.lower()  # urlsplit drops an IPv6 address's brackets: put them back
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}" if port in (None, DEFAULT_PORTS[scheme]) else f"{scheme}://{host}:{port}"


def loopback_origins(port: int) -> frozenset[str]:
    """The origins of a page opened on this machine at `port` (local mode's URL and its aliases)."""
    return frozenset(origin_of(f"http://{host}:{port}") for host in LOOPBACK_HOSTS)


def own_origins(public: Iterable[str], local_port: int) -> frozenset[str]:
    """The page's own origins: `public`, else the loopback ones of `local_port` (the port the
    connection came to), each serialized as browsers do."""
    return frozenset(origin_of(o) for o in public) or loopback_origins(local_port)


def page_origins(public: Iterable[str], allowed: Iterable[str], local_port: int) -> frozenset[str]:
    """The origins that may open the live socket: the page's own (`own_origins`) and `allowed`."""
    return own_origins(public, local_port) | frozenset(origin_of(o) for o in allowed)


def hosts_of(origins: Iterable[str]) -> frozenset[str]:
    """The `Host` headers that name these origins (host, or host:port; a default port either way)."""
    hosts = set()
    for origin in origins:
        scheme, _, netloc = origin.partition("://")
        hosts.add(netloc)
        if netloc.endswith("]") or ":" not in netloc:  # no port: the scheme's default (an IPv6 host is bracketed)
            hosts.add(f"{netloc}:{DEFAULT_PORTS[scheme]}")
    return frozenset(hosts)


def local_port(request: web.BaseRequest, fallback: int) -> int:
    """The port the request's connection came to (not what its Host says); `fallback` without one."""
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    return int(sockname[1]) if sockname else fallback


def origin_allowed(origin: str, origins: frozenset[str]) -> bool:
    """Whether a request's Origin header is one of `origins`; no Origin (or "null") never is."""
    try:
        return bool(origin) and origin_of(origin) in origins
    except ValueError:
        return False
