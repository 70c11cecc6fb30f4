"""What every chart test shares: the Kubernetes schemas read once per process."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import kubernetes_validate.utils
import pytest


@pytest.fixture(autouse=True, scope="session")
def _kubernetes_schemas_read_once() -> Iterator[None]:
    """kubernetes-validate parses a version's whole `_definitions.json` (megabytes of JSON) on every
    `validate` call, most of a chart test's time; the files never change during a run, so each is parsed
    once (the function's own result, kept; jsonschema only reads it)."""
    original = kubernetes_validate.utils.schema_contents
    kubernetes_validate.utils.schema_contents = functools.cache(original)
    yield
    kubernetes_validate.utils.schema_contents = original
