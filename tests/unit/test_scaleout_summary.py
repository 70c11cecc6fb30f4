"""bench/scaleout_summary.py: each run set against the 1-GPU run of the same call (efficiency = value over
N x one GPU), live sessions recomputed from the counts that held, jobs against x264 alone as jobs/min."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.scaleout_summary import load, main, summarise


def lipsync(gpus: str, frames_per_s: float) -> dict:
    return {
        "frames_per_s": frames_per_s,
        "est_batch_mean": 200.0,
        "latency_p99_ms": 40.0,
        "errors": [],
        "args": {"gpus": gpus, "replicas": len(gpus.split(",")) if gpus else 1, "streams": 64, "procs": 8},
    }


def count(sessions: int, holds: bool, codec: str = "h264") -> dict:
    return {
        "codec": codec,
        "sessions": sessions,
        "holds": holds,
        "latency_ms": {"p95": 300.0 if holds else 500.0},
        "live_cpu_ms_per_session_s": 80.0,
        "gpu_utilization": {"median": 20.0},
        "client_send_lag_ms_p99": 3.0,
    }


def live(gpus: list[str], counts: list[dict]) -> dict:
    # no "largest_holding": a run cut short by the call's time limit has only its counts
    return {"avatar": {}, "counts": counts, "args": {"live_workers": 8}, "placement": {"gpus": gpus, "cores": {}}}


def jobs(gpus: list[str], per_minute: float) -> dict:
    return {
        "job": {},
        "jobs": {"jobs_per_minute": per_minute, "count": 16, "workers": 16, "gpu_utilization": {"median": 30.0}},
        "args": {
            "audio_seconds": 30.0,
            "fps": 25.0,
            "preset": "veryfast",
            "width": 1280,
            "height": 720,
            "super_resolution": "on",
        },
        "placement": {"gpus": gpus, "cores": {"render": [[0], [1]]}},
    }


ENCODE = {
    "bench": "encode",
    "width": 1280,
    "height": 720,
    "rows": [
        {"preset": "veryfast", "writers": 1, "frames_per_s": 400.0},
        {"preset": "veryfast", "writers": 16, "frames_per_s": 1500.0},  # 1500 / 750 frames * 60 = 120 jobs/min
        {"preset": "superfast", "writers": 16, "frames_per_s": 9999.0},
    ],
}


def test_efficiency_is_against_the_one_gpu_row_of_the_same_files() -> None:
    summary = summarise(
        [
            ("b.json", lipsync("0,1,2,3", 3600.0)),
            ("a.json", lipsync("", 1000.0)),
            ("c.json", lipsync("0,1", 1900.0)),
            ("d.json", lipsync("0,0", 1500.0)),  # two replicas on one GPU: one GPU's worth
        ]
    )
    rows = summary["rows"]["lipsync"]
    assert [r["gpus"] for r in rows] == [1, 1, 2, 4]
    by_gpus = {r["gpus"]: r for r in rows if r["source"] != "d.json"}
    assert by_gpus[2]["efficiency"] == pytest.approx(0.95)
    assert by_gpus[4]["efficiency"] == pytest.approx(0.9)
    assert by_gpus[4]["x_of_one_gpu"] == pytest.approx(3.6)


def test_without_a_one_gpu_row_there_is_no_efficiency() -> None:
    (row,) = summarise([("x.json", lipsync("0,1", 1900.0))])["rows"]["lipsync"]
    assert row["efficiency"] is None and row["x_of_one_gpu"] is None


def test_live_sessions_are_the_largest_count_that_held_for_h264() -> None:
    one = live([], [count(100, True), count(125, False), count(150, True, "jpeg")])
    two = live(["0", "1"], [count(100, True), count(125, True), count(150, False)])
    none = live(["0", "1", "2", "3"], [count(100, False)])
    rows = summarise([("1", one), ("2", two), ("4", none)])["rows"]["live"]
    assert [(r["gpus"], r["value"]) for r in rows] == [(1, 100), (2, 125), (4, 0)]
    assert rows[1]["efficiency"] == pytest.approx(125 / 200) and rows[1]["p95_ms"] == 300.0
    assert rows[2]["p95_ms"] is None and rows[1]["counts_run"] == [100, 125, 150]


def test_jobs_are_set_against_x264_alone_at_their_preset() -> None:
    rows = summarise([("e", ENCODE), ("j1", jobs([], 60.0)), ("j2", jobs(["0", "1"], 90.0))])["rows"]["jobs"]
    assert [r["x264_alone_jobs_per_minute"] for r in rows] == pytest.approx([120.0, 120.0])
    assert [r["ratio_to_x264_alone"] for r in rows] == pytest.approx([0.5, 0.75])
    assert rows[1]["efficiency"] == pytest.approx(0.75) and rows[1]["pinned"]
    other_size = {**ENCODE, "width": 640, "height": 360}
    (row,) = summarise([("e", other_size), ("j1", jobs([], 60.0))])["rows"]["jobs"]
    assert row["x264_alone_jobs_per_minute"] is None and row["ratio_to_x264_alone"] is None


def test_the_command_reads_a_folder_and_skips_what_is_not_a_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "one.json").write_text(json.dumps(lipsync("", 1000.0)))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "two.json").write_text(json.dumps(lipsync("0,1", 1800.0)))
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "env.json").write_text(json.dumps({"nvidia": "H100"}))
    assert len(load([tmp_path])) == 3
    assert main([str(tmp_path), "--out", str(tmp_path / "summary.json")]) == 0
    text = capsys.readouterr().out
    assert "| 2 | 1,800 | 1.80 | 0.90 |" in text
    assert json.loads((tmp_path / "summary.json").read_text())["lipsync"][1]["efficiency"] == pytest.approx(0.9)
    assert len(summarise(load([tmp_path]))["rows"]["lipsync"]) == 2  # its own output is not read as a result
