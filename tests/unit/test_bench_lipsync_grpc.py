"""bench/bench_lipsync_grpc.py --model musetalk: the 256 px tier's stage through gRPC, for real (the
weight-free stand-in on the CPU, a few seconds): frames come back and the JSON names the tier's model."""

from __future__ import annotations

import json
from pathlib import Path

from bench.bench_lipsync_grpc import main


def test_the_musetalk_bench_measures_the_tiers_stage(tmp_path: Path) -> None:
    out = tmp_path / "musetalk.json"
    rc = main(
        [
            *("--device", "cpu", "--model", "musetalk", "--standin", "--streams", "2", "--items", "2"),
            *("--seconds", "4", "--warmup-seconds", "1", "--max-batch", "4", "--out", str(out)),
        ]
    )
    result = json.loads(out.read_text())
    assert rc == 0, result["errors"]
    assert result["frames_measured"] > 0 and result["model"]["name"] == "musetalk-standin"
    assert result["checkpoint"] == "standin" and result["args"]["model"] == "musetalk"
