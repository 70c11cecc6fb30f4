"""The URLs the gateway fetches (SubmitJob's audio_uri) or calls (a job's callback_url): parsed once,
checked, and sent as that same object.

The HTTP client is aiohttp, and aiohttp reads URLs with yarl; a check made by another parser (urllib)
can read a host the client never connects to. So `parse_url` makes the one `yarl.URL` of a URL, with
`encoded=True`: yarl neither re-quotes it nor removes dot segments, so what the caller wrote is, byte
for byte, what goes on the wire. Each use's rules (services.gateway.audio_uri, .webhooks: the scheme,
the bucket, the host allow-list) look at that object and wrap it in a `CheckedUrl`, the only type the
fetcher and the webhook sender take: nothing is sent that was not checked, nothing checked that is
not sent.

Before yarl sees it, the text must be a URL that every parser reads alike (docs/decisions.md, "One
parser for outbound URLs"); anything else is INVALID_ARGUMENT naming the character or the part:

- only RFC 3986's characters (ASCII letters, digits and ``-._~:/?#[]@!$&'()*+,;=%``), so no
  backslash (WHATWG parsers read it as `/`, RFC 3986 ones as data), no tab, CR, LF, space or other
  control character (WHATWG parsers drop tab, CR and LF silently), no non-ASCII character (IDNA maps
  U+FF0E, U+3002 and U+FF61 to `.`: an internationalised host is written in its `xn--` form, anything
  else percent-encoded as UTF-8);
- every `%` starts a `%XX` escape, and none encodes a backslash (`%5C`, which servers that decode
  it read as `/`) or a control character (`%00`-`%1F`, `%7F`), anywhere in the URL;
- `<scheme>://<host>[:<port>]` with no user name or password (`user:pass@`), a host of dot-separated
  labels of letters, digits, `-` and `_` (no empty label, no trailing dot, no `%`) or a bracketed
  IPv6 address without a zone id (`%25eth0`), a port of 1..65535 written as plain digits;
- no fragment (`#...`: never sent, so not what the caller meant to name).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Collection

import yarl

from services.serving.errors import InvalidRequest

MAX_URL_CHARS = 2048
DEFAULT_PORTS = {"https": 443, "http": 80}

# RFC 3986's unreserved, reserved and "%" characters: the whole alphabet of a URI.
_URI_CHAR = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_FORBIDDEN_ESCAPE = re.compile(r"%(5[Cc]|[01][0-9A-Fa-f]|7[Ff])")
_ABSOLUTE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<authority>[^/?#]*)(?P<rest>[/?#].*)?", re.S)
_HAS_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_LABEL = re.compile(r"[A-Za-z0-9_\-]+")
_PORT = re.compile(r"[1-9][0-9]{0,4}")


@dataclasses.dataclass(frozen=True)
class CheckedUrl:
    """A URL its use's rules accepted (AudioFetcher.check, CallbackRules.url): the very object the
    HTTP client is handed (aiohttp takes a yarl.URL as it is, without parsing it again)."""

    url: yarl.URL

    def __str__(self) -> str:
        return str(self.url)


def _refuse(field: str, text: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{field} {text[:200]!r}: {why}")


def check_characters(text: str, field: str) -> None:
    """InvalidRequest unless `text` is made of RFC 3986's characters and escapes only, none of them
    a backslash or a control character, raw or percent-encoded (see the module's doc for why)."""
    if len(text) > MAX_URL_CHARS:
        raise InvalidRequest(f"{field} is {len(text)} characters; the limit is {MAX_URL_CHARS}")
    for i, ch in enumerate(text):
        if _URI_CHAR.fullmatch(ch):
            continue
        if ch == "\\":
            why = "a backslash is not allowed anywhere in a URL (some parsers read it as '/', others as data)"
        elif ch in "\t\r\n":
            why = "tabs and line breaks are not allowed in a URL (some parsers drop them silently)"
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            why = f"control character U+{ord(ch):04X} is not allowed in a URL"
        elif ch == " ":
            why = "a space is not allowed in a URL; percent-encode it (%20)"
        elif ord(ch) > 0x7F:
            why = (
                f"character {ch!r} (U+{ord(ch):04X}) is not ASCII: write an internationalised host in its xn-- form "
                "and percent-encode anything else as UTF-8 (look-alike dots such as U+FF0E would become '.')"
            )
        else:
            why = f"character {ch!r} must be percent-encoded (%{ord(ch):02X})"
        raise _refuse(field, text, f"{why} (position {i})")
    if bad := _BAD_ESCAPE.search(text):
        raise _refuse(field, text, f"'%' at position {bad.start()} does not start a %XX escape")
    if bad := _FORBIDDEN_ESCAPE.search(text):
        what = "a backslash" if bad.group(1).upper() == "5C" else "a control character"
        raise _refuse(
            field, text, f"{bad.group(0)} (position {bad.start()}) encodes {what}, which is not allowed in a URL"
        )


def _split_authority(authority: str, field: str, text: str) -> tuple[str, int | None]:
    """The host (lowercase; an IPv6 address compressed, without brackets) and the port (None when
    not written) of a URL's authority; InvalidRequest naming what is wrong."""
    if "@" in authority:
        raise _refuse(
            field, text, "a user name or password (user:pass@host) is not allowed in a URL; name the host alone"
        )
    if authority.startswith("["):
        address, _, rest = authority[1:].partition("]")
        if "%" in address:
            raise _refuse(field, text, "an IPv6 zone id (%25...) is not allowed in a URL")
        host = _ipv6(address)
        if host is None:
            raise _refuse(field, text, f"[{address}] is not an IPv6 address")
        if rest and not rest.startswith(":"):
            raise _refuse(field, text, "write an IPv6 host as [<address>] or [<address>]:<port>")
        has_port, port = bool(rest), rest[1:]
    else:
        host, colon, port = authority.partition(":")
        has_port = bool(colon)
        if "%" in host:
            raise _refuse(field, text, "percent-encoded characters are not allowed in a host")
        if not host:
            raise _refuse(field, text, "the URL names no host")
        if host.endswith("."):
            raise _refuse(field, text, f"host {host!r} ends with '.'; write it without the trailing dot")
        if not all(_LABEL.fullmatch(label) for label in host.split(".")):
            raise _refuse(field, text, f"host {host!r} is not a host name (dot-separated letters, digits, '-' and '_')")
        host = host.lower()
    if not has_port:
        return host, None
    if not _PORT.fullmatch(port) or int(port) > 65535:
        raise _refuse(field, text, f"the port {port!r} is not a number in 1..65535")
    return host, int(port)


def _ipv6(address: str) -> str | None:
    """An IPv6 address in its compressed form; None when `address` is not one."""
    try:
        return ipaddress.IPv6Address(address).compressed
    except ValueError:
        return None


def parse_url(text: str, field: str, schemes: Collection[str], scheme_hint: str) -> yarl.URL:
    """`text` as the one yarl.URL the gateway checks and sends (`encoded=True`: sent as written);
    InvalidRequest, with `field` and the reason, for a URL the module's rules refuse, and with
    `scheme_hint` for a scheme not in `schemes` (lowercase)."""
    check_characters(text, field)
    parts = _ABSOLUTE.fullmatch(text)
    if parts is None or parts["scheme"].lower() not in schemes:
        raise _refuse(field, text, scheme_hint)
    if "#" in text:
        raise _refuse(field, text, "a fragment (#...) is never sent to the server; remove it")
    host, port = _split_authority(parts["authority"], field, text)
    url = yarl.URL(text, encoded=True)
    # The rules above leave nothing for two parsers to read differently; this is their tripwire.
    raw_host = (url.raw_host or "").lower()
    if ":" in raw_host:
        raw_host = _ipv6(raw_host) or raw_host
    if (url.scheme, raw_host, url.explicit_port, url.raw_user) != (parts["scheme"].lower(), host, port, None):
        raise _refuse(field, text, "the URL reads differently to the HTTP client; write it plainly")
    return url


def resolve_redirect(base: yarl.URL, location: str, field: str) -> str:
    """A redirect's Location (absolute, or relative to `base`) as an absolute URL's text, resolved
    as aiohttp resolves redirects (yarl's join), for parse_url to check like any other URL."""
    check_characters(location, field)
    if _HAS_SCHEME.match(location):
        return location
    return str(base.join(yarl.URL(location, encoded=True)))


def host_port(url: yarl.URL) -> str:
    """`host:port` of a parsed URL, as allow-lists hold it: the host lowercase (an IPv6 address
    bracketed, compressed), the scheme's default port when none is written."""
    host = (url.raw_host or "").lower()
    if ":" in host:
        host = f"[{_ipv6(host) or host}]"
    return f"{host}:{url.explicit_port or DEFAULT_PORTS.get(url.scheme, 0)}"


def allowed_hosts(setting: str, default_port: int = 443) -> frozenset[str]:
    """A host list setting (`a.example.com,b.example.com:8443,[::1]:8080`: audio_uri_hosts,
    callback_hosts, callback_http_hosts) as `host_port` entries; `default_port` for an entry without one."""
    hosts = set()
    for entry in filter(None, (e.strip().lower() for e in setting.split(","))):
        host, port = entry, str(default_port)
        if entry.startswith("["):
            address, _, rest = entry[1:].partition("]")
            host, port = address, rest[1:] if rest.startswith(":") else port
        elif entry.rsplit(":", 1)[-1].isdigit():
            host, _, port = entry.rpartition(":")
        if ":" in host:  # an IPv6 address, bracketed as host_port writes it
            host = f"[{_ipv6(host) or host}]"
        hosts.add(f"{host}:{int(port) if port.isdigit() else port}")
    return frozenset(hosts)


def check_host(url: yarl.URL, hosts: frozenset[str], field: str, setting: str, advice: str) -> None:
    """InvalidRequest unless the parsed URL's `host:port` is on the allow-list `hosts` (the setting
    named `setting`); `advice` says what the caller can do instead."""
    host = host_port(url)
    if host not in hosts:
        listed = ", ".join(sorted(hosts)) or "none"
        raise InvalidRequest(f"{field} {url}: host {host} is not on this gateway's {setting} ({listed}); {advice}")
