"""Tenants: who owns an avatar or a job. Every public RPC finds only the caller's tenant's objects.

A tenant is named in the API-key file (`tenant/name:key`, several keys per tenant for rotation; see
services.serving.auth.parse_api_keys). This module holds the rules both the interceptor and the
stores need, so the stores do not import the gRPC layer.
"""

from __future__ import annotations

#: The tenant of every call when API keys are off, and of every row made before tenants existed (the
#: store's migration to schema 3). A keys file may name it (`default/ops:key`) to keep reaching them.
IMPLICIT_TENANT = "default"


def tenant_of_key(key_name: str) -> str:
    """The tenant of an API key's name: `acme/ci` -> "acme"; a name without a tenant (`alice`, the
    format before tenants) is its own tenant, "alice", so old files never put two keys together."""
    tenant, sep, _ = key_name.partition("/")
    return tenant if sep else key_name
