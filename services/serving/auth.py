"""Who may call a lipline server: API keys and the internal token.

`Auth` is checked by the interceptor (services.serving.interceptor) before anything else, health and
reflection exempt:
- API keys (the public API, `--api-keys-file`): every call carries one of the configured keys in
  `x-api-key` (or `authorization: Bearer <key>`), else it ends UNAUTHENTICATED. Keys are compared in
  constant time (`hmac.compare_digest`) and never logged: logs name the key, or a short hash of an
  unknown one.
- The internal token (the stages, `--internal-token-file`): every call carries it in
  `x-lipline-internal`, else UNAUTHENTICATED.

INTERNAL_TOKEN_HEADER is defined here only: the servers check it, the stage channels
(services.serving.channels) send it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

API_KEY_HEADER = "x-api-key"
AUTHORIZATION_HEADER = "authorization"
INTERNAL_TOKEN_HEADER = "x-lipline-internal"
MIN_API_KEY_CHARS = 16
MAX_API_KEY_CHARS = 128
_NAME_PART = r"[A-Za-z0-9_.@-]{1,64}"
_KEY_NAME = re.compile(rf"^(?:{_NAME_PART}/)?{_NAME_PART}$")  # `tenant/name` or `name`
_KEY_CHARS = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces


def key_hash(secret: str) -> str:
    """What logs show of a secret: "sha256:<first 8 hex digits>"."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:8]


def parse_api_keys(text: str, source: str = "the API keys file") -> dict[str, str]:
    """Key name -> key, from one `tenant/name:key`, `name:key` or bare `key` per line (blank lines and
    `#` comments are skipped). The name's tenant is the part before "/"; a name without one is its own
    tenant (services.serving.tenants.tenant_of_key), and a bare key is named after its hash,
    "key-<8 hex digits>", so logs never show it. Several names of one tenant are its keys (rotation).

    Raises:
        ValueError: naming the line (never the key): a key shorter than MIN_API_KEY_CHARS, longer than
            MAX_API_KEY_CHARS or not printable ASCII, a bad or repeated name, a repeated key, or no key at all.
    """
    keys: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, key = line.partition(":")
        if not sep:
            name, key = "key-" + hashlib.sha256(line.encode()).hexdigest()[:8], line
        name, key = name.strip(), key.strip()
        where = f"{source}, line {number}"
        if not _KEY_NAME.match(name):
            raise ValueError(
                f"{where}: a key name is `tenant/name` or `name`, each 1-64 of A-Z a-z 0-9 _ . @ - (the line is `tenant/name:key`, `name:key` or `key`)"
            )
        if not (MIN_API_KEY_CHARS <= len(key) <= MAX_API_KEY_CHARS and _KEY_CHARS.match(key)):
            raise ValueError(
                f"{where} ({name}): a key is {MIN_API_KEY_CHARS}..{MAX_API_KEY_CHARS} printable ASCII characters without spaces"
            )
        if name in keys:
            raise ValueError(f"{where}: the key name {name!r} appears twice")
        if any(hmac.compare_digest(key, other) for other in keys.values()):
            raise ValueError(f"{where} ({name}): the same key appears twice")
        keys[name] = key
    if not keys:
        raise ValueError(
            f"{source} holds no key: every call would be refused (leave api_keys_file empty to turn keys off)"
        )
    return keys


def read_secret_file(path: str, what: str) -> str:
    """A secret file's text, or ValueError naming the file (never its content)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"cannot read the {what} {path}: {exc.__class__.__name__}: {getattr(exc, 'strerror', '') or exc}"
        ) from None


def _text(value: Any) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Auth:
    """Who may call: API keys (name -> key) and/or the internal token; both empty = anyone."""

    api_keys: Mapping[str, str] = field(default_factory=dict)
    internal_token: str = ""

    @classmethod
    def from_files(cls, api_keys_file: str = "", internal_token_file: str = "") -> Auth:
        """Read the settings' files (empty path = that check off). Raises ValueError on a bad file."""
        keys = parse_api_keys(read_secret_file(api_keys_file, "API keys file"), api_keys_file) if api_keys_file else {}
        token = ""
        if internal_token_file:
            token = read_secret_file(internal_token_file, "internal token file").strip()
            if not (MIN_API_KEY_CHARS <= len(token) <= 4096 and _KEY_CHARS.match(token)):
                raise ValueError(
                    f"the internal token in {internal_token_file} must be {MIN_API_KEY_CHARS}..4096 printable ASCII characters without spaces"
                )
        return cls(dict(keys), token)

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys or self.internal_token)

    def authenticate(self, metadata: Mapping[str, Any]) -> str:
        """The API key's name ("" when API keys are off) of a call whose metadata passes every check
        (its tenant: services.serving.tenants.tenant_of_key).

        Raises:
            PermissionError: why the call is refused, fit for the caller (never the key itself).
        """
        if self.internal_token:
            sent = metadata.get(INTERNAL_TOKEN_HEADER)
            if sent is None:
                raise PermissionError(
                    f"this service accepts only calls from lipline's own services: send the internal "
                    f"token in the {INTERNAL_TOKEN_HEADER} metadata (internal_token_file)"
                )
            if not hmac.compare_digest(_text(sent).encode(), self.internal_token.encode()):
                raise PermissionError(
                    f"the {INTERNAL_TOKEN_HEADER} metadata does not hold this deployment's internal token"
                )
        if not self.api_keys:
            return ""
        key = metadata.get(API_KEY_HEADER)
        if key is None:
            bearer = _text(metadata.get(AUTHORIZATION_HEADER, ""))
            scheme, _, rest = bearer.partition(" ")
            key = rest.strip() if scheme.lower() == "bearer" and rest.strip() else None
        if key is None:
            raise PermissionError(
                f"this API needs an API key: send an API key in the {API_KEY_HEADER} metadata (or {AUTHORIZATION_HEADER}: Bearer <key>)"
            )
        sent = _text(key).encode()
        found = ""
        for name, secret in self.api_keys.items():  # every key compared: the time does not tell which matched
            if hmac.compare_digest(sent, secret.encode()):
                found = name
        if not found:
            raise PermissionError(
                f"the API key in the {API_KEY_HEADER} metadata is not valid here ({key_hash(_text(key))}); "
                "send an API key in the x-api-key metadata that this deployment knows"
            )
        return found
