"""Labels and label selectors (services.gateway.labels): Kubernetes' rules, each refusal naming the label."""

from __future__ import annotations

import pytest

from services.gateway.labels import MAX_LABELS, check_labels, parse_selector
from services.serving.errors import InvalidRequest


def test_kubernetes_style_labels_pass() -> None:
    labels = {"order": "42", "example.com/user-id": "u_1.a", "a": "", "A-b_c.d": "Z"}
    assert check_labels(labels) == labels


@pytest.mark.parametrize(
    ("labels", "words"),
    [
        ({"": "v"}, "label key '' is not valid"),
        ({"-order": "v"}, "label key '-order' is not valid"),
        ({"order-": "v"}, "is not valid"),
        ({"a" * 64: "v"}, "is not valid: a key is [prefix/]name"),
        ({"sp ace": "v"}, "is not valid"),
        ({"/name": "v"}, "has an empty prefix"),
        ({"Example.com/name": "v"}, "which is not a DNS subdomain"),
        ({"a..b/name": "v"}, "which is not a DNS subdomain"),
        ({"k": "v" * 64}, "label 'k' has value"),
        ({"k": "has space"}, "label 'k' has value 'has space'"),
        ({"k": "-v"}, "label 'k' has value"),
        ({f"k{i}": "v" for i in range(MAX_LABELS + 1)}, "65 labels; the limit is 64"),
    ],
)
def test_bad_labels_are_refused_naming_the_label(labels: dict[str, str], words: str) -> None:
    with pytest.raises(InvalidRequest, match=words.replace("[", r"\[").replace(".", r"\.")):
        check_labels(labels)


def test_a_selector_is_key_value_pairs() -> None:
    assert parse_selector("") == {} and parse_selector("  ") == {}
    assert parse_selector("order=42") == {"order": "42"}
    assert parse_selector(" order = 42 , example.com/user==u1,empty=") == {
        "order": "42",
        "example.com/user": "u1",
        "empty": "",
    }


@pytest.mark.parametrize(
    ("selector", "words"),
    [
        ("order", "term 'order' is not key=value"),
        ("order=1,", "term '' is not key=value"),
        ("=1", "term '=1' is not key=value"),
        ("order!=1", "label key 'order!' is not valid"),
        ("order=1,order=2", "asks for order=1 and order=2"),
        ("k=bad value", "label 'k' has value 'bad value'"),
        ("k=" + "v" * 5000, "label_selector is 5002 characters"),
    ],
)
def test_bad_selectors_are_refused_saying_what_to_write(selector: str, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        parse_selector(selector)
