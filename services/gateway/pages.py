"""Page sizes and page tokens of ListJobs and ListAvatars.

A token is the last row of the page it follows (its create_time and id: a keyset cursor, so rows
inserted while a client pages never shift or repeat what comes next), signed with HMAC-SHA256
under a key every gateway replica reads from the job store (`JobStore.shared_key`), over the
caller's tenant and the list's filters too. So a token is opaque (clients must not build them),
answers INVALID_ARGUMENT when altered, when another tenant sends it, or when it is sent with other
filters than it was issued for (AIP-158), and any replica accepts another's tokens.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping

from services.jobs.store.jobs import PageCursor
from services.serving.errors import InvalidRequest

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
MAX_TOKEN_CHARS = 512
_SIGNATURE_BYTES = 16  # 128 bits: forging one is out of reach; shorter tokens in URLs and logs
PAGE_KEY_NAME = "page_tokens"


def page_size(requested: int) -> int:
    """DEFAULT_PAGE_SIZE when unset; above MAX_PAGE_SIZE lowered to it (AIP-158: not an error)."""
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class PageTokens:
    """Issues and reads page tokens under one key (32 random bytes shared by the gateways)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _sign(self, tenant: str, query: Mapping[str, object], payload: str) -> str:
        bound = json.dumps([tenant, query, payload], sort_keys=True, separators=(",", ":"))
        return _b64(hmac.new(self._key, bound.encode(), hashlib.sha256).digest()[:_SIGNATURE_BYTES])

    def issue(self, tenant: str, query: Mapping[str, object], last: PageCursor) -> str:
        """The token of the page after `last` for this tenant and these filters (`query`, JSON-able)."""
        payload = _b64(json.dumps([last.create_time, last.id], separators=(",", ":")).encode())
        return f"{payload}.{self._sign(tenant, query, payload)}"

    def read(self, tenant: str, query: Mapping[str, object], token: str) -> PageCursor | None:
        """The cursor in `token` (None for ""); InvalidRequest unless this gateway's key signed it for
        this tenant and these filters."""
        if not token:
            return None
        refused = InvalidRequest(
            "page_token is not one this API issued for this request: pass the next_page_token of the previous page "
            "unchanged, with the same filters (another filter starts again without a page_token)"
        )
        payload, dot, signature = token.partition(".")
        if len(token) > MAX_TOKEN_CHARS or not dot:
            raise refused
        if not hmac.compare_digest(signature, self._sign(tenant, query, payload)):
            raise refused
        try:
            create_time, row_id = json.loads(_unb64(payload))
            return PageCursor(float(create_time), str(row_id))
        except (ValueError, TypeError, binascii.Error):
            raise refused from None
