"""Labels on jobs and avatars, and ListJobs' label selector, checked as Kubernetes checks its labels.

Why Kubernetes' rules: backends that run on it already know them, a label copied from a pod's
metadata is valid here too, and they keep labels short and printable (they are stored per job and
indexed). A key is `[prefix/]name`: the name 1-63 characters of [A-Za-z0-9-_.], alphanumeric at
both ends; the optional prefix a DNS subdomain (lowercase, at most 253 characters). A value is 0-63
characters of the same kind as a name. Every violation is INVALID_ARGUMENT naming the label.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from services.serving.errors import InvalidRequest

MAX_LABELS = 64
MAX_NAME_CHARS = 63
MAX_PREFIX_CHARS = 253
MAX_SELECTOR_CHARS = 4096
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_RULES = "[prefix/]name, the name 1-63 characters of A-Z a-z 0-9 - _ . beginning and ending alphanumeric"


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:80] + "...")


def check_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        raise InvalidRequest(f"label key {_shown(key)} has an empty prefix before '/'; a key is {_RULES}")
    if not name or len(name) > MAX_NAME_CHARS or not _NAME.fullmatch(name):
        raise InvalidRequest(f"label key {_shown(key)} is not valid: a key is {_RULES}")
    if prefix and (len(prefix) > MAX_PREFIX_CHARS or not all(_DNS_LABEL.fullmatch(part) for part in prefix.split("."))):
        raise InvalidRequest(
            f"label key {_shown(key)} has prefix {_shown(prefix)}, which is not a DNS subdomain "
            f"(lowercase a-z 0-9 - and dots, at most {MAX_PREFIX_CHARS} characters, e.g. example.com)"
        )


def check_value(key: str, value: str) -> None:
    if value and (len(value) > MAX_NAME_CHARS or not _NAME.fullmatch(value)):
        raise InvalidRequest(
            f"label {key!r} has value {_shown(value)}, which is not valid: a value is empty or 1-63 characters "
            "of A-Z a-z 0-9 - _ . beginning and ending alphanumeric"
        )


def check_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels as a plain dict, each key and value checked (InvalidRequest naming the first bad one)."""
    if len(labels) > MAX_LABELS:
        raise InvalidRequest(f"{len(labels)} labels; the limit is {MAX_LABELS}")
    for key, value in labels.items():
        check_key(key)
        check_value(key, value)
    return dict(labels)


def parse_selector(selector: str) -> dict[str, str]:
    """`key=value[,key=value]` (`==` too, spaces around terms ignored) -> the pairs every match has.
    An empty selector selects everything."""
    if len(selector) > MAX_SELECTOR_CHARS:
        raise InvalidRequest(f"label_selector is {len(selector)} characters; the limit is {MAX_SELECTOR_CHARS}")
    pairs: dict[str, str] = {}
    if not selector.strip():
        return pairs
    for term in selector.split(","):
        key, eq, value = term.partition("=")
        value = value[1:] if value.startswith("=") else value  # "k==v" as Kubernetes accepts it
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise InvalidRequest(
                f"label_selector term {_shown(term.strip())} is not key=value; write key=value[,key=value]"
            )
        check_key(key)
        check_value(key, value)
        if pairs.get(key, value) != value:
            raise InvalidRequest(f"label_selector asks for {key}={pairs[key]} and {key}={value}: no job has both")
        pairs[key] = value
    if len(pairs) > MAX_LABELS:
        raise InvalidRequest(f"label_selector has {len(pairs)} terms; the limit is {MAX_LABELS}")
    return pairs
