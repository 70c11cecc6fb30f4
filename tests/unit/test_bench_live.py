"""bench/bench_live.py's own rules: the sessions' script (real time, pauses, one Clear) and how a
session's received frames become latencies, missing frames and Clear -> idle (the figures issue 19's
acceptance is judged by, so a wrong mapping would pass or fail the table on its own)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bench.bench_live import CHUNK_MS, PAUSE_S, SessionRecord, session_script

RATE, FPS = 16000, 25.0
CHUNK = RATE * CHUNK_MS // 1000


@pytest.mark.parametrize("seed", range(6))
def test_the_script_is_real_time_speech_with_pauses_and_one_clear(seed: int) -> None:
    speech = (np.arange(RATE * 3) % 2000 - 1000).astype(np.int16)
    seconds = 12.0
    steps = session_script(speech, RATE, seconds, random.Random(seed))

    assert [s.at for s in steps] == sorted(s.at for s in steps)
    assert all(0 <= s.at <= seconds for s in steps)
    assert [s.kind for s in steps].count("clear") == 1
    utterances = sorted({s.utterance for s in steps})
    assert utterances == list(range(len(utterances))) and len(utterances) >= 2
    clear = next(s for s in steps if s.kind == "clear")
    assert clear.utterance == 1  # the second utterance is interrupted
    for k in utterances:
        mine = [s for s in steps if s.utterance == k]
        audio = [s for s in mine if s.kind == "audio"]
        assert all(len(s.pcm) == 2 * CHUNK for s in audio)
        assert np.allclose(np.diff([s.at for s in audio]), CHUNK_MS / 1000)  # 20 ms apart: real time
        last = mine[-1]
        assert last.kind == ("clear" if k == clear.utterance else "end")
        if k == clear.utterance:  # at 40-60 % of a 2-4 s utterance; the rest of it is never sent
            assert 0.4 * 2.0 - 0.02 <= len(audio) * CHUNK / RATE <= 0.6 * 4.0 + 0.02
            assert last.at == pytest.approx(audio[-1].at + CHUNK_MS / 1000)
        if k + 1 in utterances:  # then a pause with nothing sent
            gap = next(s for s in steps if s.utterance == k + 1).at - last.at
            assert PAUSE_S[0] - 1e-9 <= gap <= PAUSE_S[1] + 0.03


def record_of_one_utterance(start_frame: int, arrive_after_s: float, skip: set[int] = frozenset()) -> SessionRecord:
    """An utterance of 50 chunks (1 s) sent from t = 100 s, PLAYBACK_STARTED at `start_frame`; its
    speech frame j arrives `arrive_after_s` after the chunk that holds the end of its audio."""
    record = SessionRecord("s", FPS, RATE, started=100.0)
    record.sent[0] = [100.0 + i * 0.02 for i in range(50)]
    record.sent_ends[0] = [(i + 1) * CHUNK for i in range(50)]
    record.started_at_frame[1] = start_frame
    for j in range(25):
        if j in skip:
            continue
        chunk = 2 * j + 1  # frame j's audio ends at sample 640 (j + 1): the end of chunk 2j + 1
        record.frames.append((start_frame + j, True, 1, record.sent[0][chunk] + arrive_after_s, 100))
    return record


def test_latency_is_from_the_chunk_ending_the_frames_audio_to_the_frame() -> None:
    summary = record_of_one_utterance(start_frame=40, arrive_after_s=0.25).summary()
    assert len(summary["latencies"]) == 25
    assert np.allclose(summary["latencies"], 0.25)
    assert summary["missing"] == 0 and summary["speech_frames"] == 25


def test_skipped_slots_count_as_missing_and_do_not_shift_the_latency() -> None:
    summary = record_of_one_utterance(start_frame=7, arrive_after_s=0.3, skip={3, 4, 11}).summary()
    assert summary["missing"] == 3
    assert len(summary["latencies"]) == 22
    assert np.allclose(summary["latencies"], 0.3)  # frame j is still matched to its own audio


def test_clear_to_idle_is_the_first_frame_that_is_not_the_interrupted_speech() -> None:
    record = record_of_one_utterance(start_frame=0, arrive_after_s=0.2)
    record.clear_sent, record.clear_utterance = 100.3, 1
    # speech frames after 100.3 are stale ones still in flight; then idle frames from index 25
    last_arrival = record.frames[-1][3]
    record.frames += [(25 + i, False, 0, last_arrival + 0.04 * (i + 1), 50) for i in range(3)]
    record.finished[1] = (100.35, True)
    summary = record.summary()
    assert summary["clear_idle_s"] == pytest.approx(last_arrival + 0.04 - 100.3)
    assert summary["clear_event_s"] == pytest.approx(0.05)


def test_frames_before_the_start_are_not_measured() -> None:
    record = record_of_one_utterance(start_frame=10, arrive_after_s=0.2)
    record.frames = [
        (i, False, 0, 99.0 + 0.04 * i, 50) for i in range(10)
    ] + record.frames  # idle frames before t = 100
    record.frames[3:5] = []  # a gap before the start does not count
    summary = record.summary()
    assert summary["frames"] == 25 and summary["missing"] == 0
