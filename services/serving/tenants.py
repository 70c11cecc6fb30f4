"""Tenants: who owns an avatar or a job. Every public RPC finds only the caller's tenant's objects.

A tenant is named in the API-key file (`tenant/name:key`, several keys per tenant for rotation; see
services.serving.auth.parse_api_keys). This module holds the rules both the interceptor and the
stores need, so the stores do not import the gRPC layer.
"""

from __future__ import annotations

import re

#: The tenant of every call when API keys are off, and of every row made before tenants existed (the
#: store's migration to schema 3). A keys file may name it (`default/ops:key`) to keep reaching them.
IMPLICIT_TENANT = "default"


def tenant_of_key(key_name: str) -> str:
    """The tenant of an API key's name: `acme/ci` -> "acme"; a name without a tenant (`alice`, the
    format before tenants) is its own tenant, "alice", so old files never put two keys together."""
    tenant, sep, _ = key_name.partition("/")
    return tenant if sep else key_name


MIN_WEBHOOK_SECRET_CHARS = 24
_TENANT = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")  # a tenant as the API-key file names one
_SECRET = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces


def parse_webhook_secrets(text: str, source: str = "the webhook secrets file") -> dict[str, str]:
    """Tenant -> the secret its webhooks are signed with, from one `tenant:secret` per line (blank
    lines and `#` comments skipped). A tenant is named as in the API-key file (`acme` for the keys
    `acme/...`; `default` when keys are off). One secret per tenant: rotating it is a new file and a
    rolling restart, and receivers accept both secrets for the rollout's length.

    Raises:
        ValueError: naming the line (never the secret): a bad tenant, a secret shorter than
            MIN_WEBHOOK_SECRET_CHARS or not printable ASCII, or a tenant listed twice.
    """
    secrets: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        tenant, sep, secret = (part.strip() for part in line.partition(":"))
        where = f"{source}, line {number}"
        if not sep or not _TENANT.match(tenant):
            raise ValueError(f"{where}: a line is `tenant:secret`, the tenant 1-64 of A-Z a-z 0-9 _ . @ -")
        if not (MIN_WEBHOOK_SECRET_CHARS <= len(secret) <= 256 and _SECRET.match(secret)):
            raise ValueError(
                f"{where} ({tenant}): a webhook secret is {MIN_WEBHOOK_SECRET_CHARS}..256 printable ASCII characters without spaces"
            )
        if tenant in secrets:
            raise ValueError(f"{where}: the tenant {tenant!r} appears twice")
        secrets[tenant] = secret
    return secrets
