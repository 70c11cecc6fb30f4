"""bench/pyspy_summary.py: idle waits are not CPU, and a function counts once per sample however deep."""

from __future__ import annotations

from pathlib import Path

from bench.pyspy_summary import summarise

RAW = """\
thread (1): MainThread;run (services/serving/server.py:221);EpollSelector.select (selectors.py:468) 90
thread (1): MainThread;run (services/serving/server.py:221);push (services/live/mel_stream.py:154);push (services/live/mel_stream.py:154) 30
thread (2): live-frames_0;_worker (concurrent/futures/thread.py:92);encode (services/live/encoders.py:166) 60
thread (2): live-frames_0;_worker (concurrent/futures/thread.py:81) 500
"""


def test_idle_waits_are_left_out_and_recursion_counts_once(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW)
    text = summarise(raw, top=10)
    assert text.startswith("busy samples: 90")
    assert "| thread (2): live-frames_0 | 60 | 67% |" in text
    assert "| push (services/live/mel_stream.py:154) | 30 | 33% |" in text  # self and inclusive alike
    assert text.count("| push (services/live/mel_stream.py:154) | 30 |") == 2
    assert "EpollSelector" not in text and "thread.py:81" not in text
