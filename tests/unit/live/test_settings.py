"""LiveSettings: the registry's ports, and values that cannot work refused with one message each."""

from __future__ import annotations

import pytest

from services.live.settings import LiveSettings
from services.serving.settings import parse_settings
from services.serving.stages import STAGES


def test_defaults_are_the_registrys_and_valid() -> None:
    s = LiveSettings()
    s.validate()
    assert (s.port, s.metrics_port) == (STAGES["live"].port, STAGES["live"].metrics_port)
    assert (s.x264_preset, s.max_chunk_ms, s.max_sessions) == ("ultrafast", 100, 16)


def test_flags_set_the_limits() -> None:
    s = parse_settings(LiveSettings, ["--max-sessions=2", "--advertise-address=10.0.0.7:50066", "--superres-address="])
    assert (s.max_sessions, s.advertise_address, s.superres_address) == (2, "10.0.0.7:50066", "")


def test_a_musetalk_session_sends_its_frames_further_ahead() -> None:
    """The 256 px tier's stage takes ~35-80 ms a batch: its sessions get their own lead (flag too)."""
    s = parse_settings(LiveSettings, ["--face-lead-s=0.03", "--musetalk-face-lead-s=0.15"])
    assert (s.face_lead(musetalk=False), s.face_lead(musetalk=True)) == (0.03, 0.15)
    assert LiveSettings().face_lead(musetalk=True) > LiveSettings().face_lead(musetalk=False)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("max_sessions", 0, "max_sessions"),
        ("x264_preset", "warp", "x264_preset"),
        ("max_chunk_ms", 5, "max_chunk_ms"),
        ("idle_timeout_s", 0.0, "idle_timeout_s"),
        ("face_lead_s", 2.0, "face_lead_s"),
        ("musetalk_face_lead_s", -0.1, "musetalk_face_lead_s"),
        ("send_queue_frames", 0, "send_queue_frames"),
        ("send_lag_s", 0.0, "send_lag_s"),
        ("lease_s", 1.0, "lease_s"),
    ],
)
def test_values_that_cannot_work_are_refused(field: str, value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        LiveSettings(**{field: value}).validate()
