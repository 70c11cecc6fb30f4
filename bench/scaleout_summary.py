#!/usr/bin/env python
"""The scale-out table (issue 32) from the JSONs one `bash bench/gpu_session.sh scaleout ...` call wrote.

Reads every JSON given (files, or folders searched for *.json) and recognises each by its content:
bench_lipsync_grpc.py (frames/s), bench_live.py (sessions per count), bench_e2e.py with --jobs (jobs per
minute) and bench_encode.py --out (x264 alone). The GPU count of a run is the number of distinct GPUs in
its --gpus (none listed: 1). Per kind, each row is set beside the 1-GPU row of the same files (pass
one call's files: the acceptance wants the baseline measured in the same call):

- lipsync frames/s through gRPC: x of 1 GPU, and scaling efficiency = frames/s / (N x 1-GPU frames/s);
- live sessions per host: the largest count that held (p95 within the limit, nothing skipped or
  missing, every session created), recomputed from the counts so a run cut short still counts;
- render jobs per minute, and their ratio to x264 alone on the same cores: bench_encode's frames/s
  with one writer per core, as jobs of the same length and frame rate per minute.

Prints markdown; --out also writes the rows as JSON.

Example:
    python bench/scaleout_summary.py var/bench/gpu --out var/bench/gpu/scaleout-summary.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

LIPSYNC_TARGET = 0.9  # issue 32: scaling efficiency of the GPU-bound stage


def gpu_count(gpus: Any) -> int:
    """Distinct GPUs in a --gpus value (a "0,1" string or a list); none listed: 1 (the default GPU)."""
    items = gpus.split(",") if isinstance(gpus, str) else list(gpus or [])
    return len({g.strip() for g in items if str(g).strip()}) or 1


def kind_of(result: dict) -> str:
    """Which bench wrote `result`: lipsync, live, jobs, encode, or "" (not part of the table)."""
    if result.get("bench") == "encode":
        return "encode"
    if "frames_per_s" in result and "args" in result:
        return "lipsync"
    if "counts" in result and "avatar" in result:
        return "live"
    if "jobs" in result and "job" in result:
        return "jobs"
    return ""


def largest_holding(result: dict, codec: str = "h264") -> dict | None:
    """The count with the most sessions that held, for `codec` (None: none did)."""
    held = [r for r in result.get("counts", []) if r.get("codec") == codec and r.get("holds")]
    return max(held, key=lambda r: r["sessions"], default=None)


def row_of(kind: str, result: dict, source: str) -> dict:
    """One run as a table row: its GPU count, its figure and what explains it."""
    args = result.get("args", {})
    row: dict[str, Any] = {"kind": kind, "source": source, "date": result.get("date", "")}
    if kind == "lipsync":
        row.update(
            gpus=gpu_count(args.get("gpus", "")),
            value=result["frames_per_s"],
            replicas=args.get("replicas"),
            streams=args.get("streams"),
            procs=args.get("procs"),
            est_batch=result.get("est_batch_mean"),
            p99_ms=result.get("latency_p99_ms"),
            errors=len(result.get("errors", [])),
        )
    elif kind == "live":
        best = largest_holding(result)
        row.update(
            gpus=gpu_count(result.get("placement", {}).get("gpus") or args.get("gpus", "")),
            value=best["sessions"] if best else 0,
            counts_run=[r["sessions"] for r in result.get("counts", []) if r.get("codec") == "h264"],
            p95_ms=best["latency_ms"]["p95"] if best else None,
            live_cpu_ms_per_session_s=best["live_cpu_ms_per_session_s"] if best else None,
            gpu_util_median=best["gpu_utilization"].get("median") if best else None,
            client_lag_p99_ms=best.get("client_send_lag_ms_p99") if best else None,
            live_workers=args.get("live_workers"),
            pinned=bool(result.get("placement", {}).get("cores")),
        )
    elif kind == "jobs":
        jobs = result["jobs"]
        gpu = jobs.get("gpu_utilization", {})
        row.update(
            gpus=gpu_count(result.get("placement", {}).get("gpus") or args.get("gpus", "")),
            value=jobs["jobs_per_minute"],
            jobs=jobs.get("count"),
            workers=jobs.get("workers"),
            audio_seconds=args.get("audio_seconds"),
            fps=args.get("fps"),
            size=f"{args.get('width')}x{args.get('height')}",
            super_resolution=args.get("super_resolution") == "on",
            preset=args.get("preset"),
            gpu_util_median=gpu.get("median"),
            host_cpu=gpu.get("host_cpu"),
            cpu_seconds_by_service=jobs.get("cpu_seconds_by_service"),
            pinned=bool(result.get("placement", {}).get("cores")),
        )
    return row


def x264_jobs_per_minute(encode: dict, job: dict) -> float | None:
    """bench_encode's frames/s at the job's preset and size (its most writers) as such jobs per minute;
    None where bench_encode ran another size or preset."""
    rows = [r for r in encode.get("rows", []) if r.get("preset") == job["preset"]]
    if (
        not rows
        or not job["audio_seconds"]
        or not job["fps"]
        or f"{encode.get('width')}x{encode.get('height')}" != job["size"]
    ):
        return None
    best = max(rows, key=lambda r: r["writers"])
    return best["frames_per_s"] / (job["audio_seconds"] * job["fps"]) * 60


def summarise(results: Iterable[tuple[str, dict]]) -> dict[str, Any]:
    """Rows per kind, each with x of and efficiency against the 1-GPU row of the same kind."""
    rows: dict[str, list[dict]] = {"lipsync": [], "live": [], "jobs": []}
    encode: dict | None = None
    for source, result in results:
        kind = kind_of(result)
        if kind == "encode":
            encode = result
        elif kind:
            rows[kind].append(row_of(kind, result, source))
    for kind_rows in rows.values():
        kind_rows.sort(key=lambda r: r["gpus"])
        base = next((r["value"] for r in kind_rows if r["gpus"] == 1), None)
        for r in kind_rows:
            r["x_of_one_gpu"] = r["value"] / base if base else None
            r["efficiency"] = r["value"] / (r["gpus"] * base) if base else None
    for r in rows["jobs"]:
        alone = x264_jobs_per_minute(encode, r) if encode else None
        r["x264_alone_jobs_per_minute"] = alone
        r["ratio_to_x264_alone"] = r["value"] / alone if alone else None
    return {"rows": rows, "encode": encode}


def _f(value: Any, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def table(summary: dict[str, Any]) -> str:
    rows = summary["rows"]
    out: list[str] = []
    if rows["lipsync"]:
        out += [
            f"lipsync (Wav2Lip) through gRPC, one replica per GPU (target efficiency >= {LIPSYNC_TARGET:g})",
            "",
            "| GPUs | frames/s | x of 1 GPU | efficiency | streams / client procs | est. batch | p99 ms | errors |",
            "|---:|---:|---:|---:|---|---:|---:|---:|",
        ]
        out += [
            f"| {r['gpus']} | {r['value']:,.0f} | {_f(r['x_of_one_gpu'])} | {_f(r['efficiency'])} | "
            f"{r['streams']} / {r['procs']} | {_f(r['est_batch'], '.0f')} | {_f(r['p99_ms'], '.0f')} | {r['errors']} |"
            for r in rows["lipsync"]
        ]
        out.append("")
    if rows["live"]:
        out += [
            "live 512x512 sessions per host (H.264, p95 within the limit, nothing skipped or missing)",
            "",
            "| GPUs | sessions held | x of 1 GPU | efficiency | counts run | p95 ms | live CPU ms / session-s | GPU util % | client lag p99 ms | pinned |",
            "|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
        ]
        out += [
            f"| {r['gpus']} | {r['value']} | {_f(r['x_of_one_gpu'])} | {_f(r['efficiency'])} | "
            f"{','.join(map(str, r['counts_run']))} | {_f(r['p95_ms'], '.0f')} | {_f(r['live_cpu_ms_per_session_s'], '.1f')} | "
            f"{_f(r['gpu_util_median'], '.0f')} | {_f(r['client_lag_p99_ms'], '.0f')} | {'yes' if r['pinned'] else 'no'} |"
            for r in rows["live"]
        ]
        out.append("")
    if rows["jobs"]:
        first = rows["jobs"][0]
        sr = "with" if first["super_resolution"] else "without"
        out += [
            f"render jobs per minute ({first['audio_seconds']:g} s at {first['size']}, {sr} super-resolution) "
            "against x264 alone on the same cores",
            "",
            "| GPUs | jobs/min | x of 1 GPU | efficiency | x264 alone jobs/min | ratio to x264 alone | GPU util % | host CPU % | pinned |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        out += [
            f"| {r['gpus']} | {r['value']:.1f} | {_f(r['x_of_one_gpu'])} | {_f(r['efficiency'])} | "
            f"{_f(r['x264_alone_jobs_per_minute'], '.1f')} | {_f(r['ratio_to_x264_alone'])} | "
            f"{_f(r['gpu_util_median'], '.0f')} | {_f(r['host_cpu'], '.0f')} | {'yes' if r['pinned'] else 'no'} |"
            for r in rows["jobs"]
        ]
        out.append("")
    return "\n".join(out) if out else "no scale-out results among the files given"


def load(paths: Iterable[Path]) -> list[tuple[str, dict]]:
    """(name, parsed JSON) of every file given and every *.json under the folders given."""
    found: list[tuple[str, dict]] = []
    for path in paths:
        files = sorted(path.rglob("*.json")) if path.is_dir() else [path]
        for f in files:
            try:
                data = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                found.append((f.name, data))
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("paths", nargs="+", type=Path, help="JSON files, or folders holding them (one call's)")
    p.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    summary = summarise(load(args.paths))
    print(table(summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary["rows"], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
