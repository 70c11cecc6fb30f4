"""audio_uri_hosts as the gateway reads it: `host` is port 443 only, `host:port` that port, case-insensitive."""

from __future__ import annotations

from services.gateway.audio_uri import allowed_hosts


def test_a_host_without_a_port_means_443_and_entries_are_normalised() -> None:
    assert allowed_hosts(" Media.Example.com, cdn.example.com:8443,,") == {
        "media.example.com:443",
        "cdn.example.com:8443",
    }


def test_an_empty_setting_allows_nothing() -> None:
    assert allowed_hosts("") == frozenset()
