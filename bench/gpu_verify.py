"""What issue 9 asks to see on a GPU, with real processes (`bash bench/gpu_session.sh verify`):

1. the lipsync service exports `lipline_gpu_utilization_ratio` (NVML, nvidia-ml-py) while it works;
2. `--warm-cache-only` (the chart's compile-cache Job) fills the compile cache on the GPU and exits 0;
3. a lipsync started with `--backend auto` on that warm cache, whose compile then fails (here: Triton
   cannot build its launcher, `CC=/bin/false` with an empty Triton cache, what an image without a C
   compiler does), falls back to `torch` and serves: it reaches SERVING and answers Generate.

Prints one line per check and writes JSON (--out). Exit 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.local.process import start

FLAGS = [
    "--host=127.0.0.1",
    "--port=0",
    "--metrics-port=0",
    "--log-format=json",
    "--grace-s=2",
    "--device=cuda",
    "--max-batch=32",
    "--batch-buckets=32",
    "--detector=none",
]


def metric_rows(port: int, name: str) -> list[str]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return [line for line in text.splitlines() if line.startswith(name)]


def generate_once(address: str) -> int:
    """A few Generate items through the service: the frames it returned."""
    import grpc
    import numpy as np

    from lipline.v1 import lipsync_pb2, lipsync_pb2_grpc
    from services.media.wire import image_to_proto, pack_generate_items

    face = np.random.default_rng(0).integers(0, 255, (96, 96, 3), np.uint8)
    mel = np.zeros((80, 16), "<f2").tobytes()
    requests = [
        lipsync_pb2.GenerateRequest(crops=[lipsync_pb2.ReferenceCrop(crop_index=0, image=image_to_proto(face))]),
        lipsync_pb2.GenerateRequest(items=pack_generate_items(list(range(8)), [0] * 8, [mel] * 8)),
    ]
    with grpc.insecure_channel(address) as channel:
        stub = lipsync_pb2_grpc.LipSyncServiceStub(channel)
        return sum(len(r.faces.frame_indices) for r in stub.Generate(iter(requests), timeout=60))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="var/bench/gpu-verify.json")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpu-verify-"))
    results: dict[str, object] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    ok = True

    # 1. the GPU metric, from a default (auto, no cache) lipsync while it serves
    svc = start("lipsync-metric", "lipsync", FLAGS, work)
    try:
        results["metric_start_s"] = round(svc.wait_ready(300), 1)
        results["metric_generate_frames"] = generate_once(svc.address)
        time.sleep(2.5)  # the sampler's period
        rows = metric_rows(svc.metrics_port, "lipline_gpu_utilization_ratio")
        results["gpu_metric_rows"] = rows
        good = any(not r.startswith("#") for r in rows)
        ok &= good
        print(f"[{'ok' if good else 'FAIL'}] lipline_gpu_utilization_ratio: {rows[:3]}")
    finally:
        svc.terminate()

    # 2. the compile-cache Job's mode
    cache = work / "compile-cache"
    t0 = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.lipsync",
            "--device=cuda",
            "--max-batch=32",
            "--batch-buckets=32",
            "--detector=none",
            "--backend=compile",
            "--warm-cache-only=true",
            f"--compile-cache-dir={cache}",
            "--log-format=text",
        ],
        capture_output=True,
        text=True,
        timeout=500,
    )
    artifacts = sorted(p.name for p in cache.glob("*")) if cache.exists() else []
    results["warm_cache_only"] = {
        "rc": done.returncode,
        "seconds": round(time.monotonic() - t0, 1),
        "artifacts": artifacts,
        "log_tail": done.stderr[-1500:],
    }
    good = done.returncode == 0 and bool(artifacts)
    ok &= good
    print(
        f"[{'ok' if good else 'FAIL'}] --warm-cache-only: rc {done.returncode}, {len(artifacts)} artifact(s), {results['warm_cache_only']['seconds']} s"
    )

    # 3. auto on the warm cache, with a compile that cannot build: falls back to torch and serves
    env = {
        "CC": "/bin/false",
        "TRITON_CACHE_DIR": str(work / "triton-empty"),
        "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-empty"),
    }
    svc = start(
        "lipsync-fallback", "lipsync", [*FLAGS, "--backend=auto", f"--compile-cache-dir={cache}"], work, env=env
    )
    try:
        results["fallback_start_s"] = round(svc.wait_ready(500), 1)
        frames = generate_once(svc.address)
        log = svc.log()
        fell_back = "falling back to torch" in log
        results["fallback"] = {
            "generate_frames": frames,
            "fell_back": fell_back,
            "decisions": [line for line in log.splitlines() if "backend auto" in line][-3:],
        }
        good = fell_back and frames == 8
        ok &= good
        print(
            f"[{'ok' if good else 'FAIL'}] auto on a warm cache whose compile fails: fell back {fell_back}, served {frames} frames"
        )
    except (RuntimeError, TimeoutError) as exc:
        results["fallback"] = {"error": str(exc)[-2000:]}
        ok = False
        print(f"[FAIL] auto fallback: {str(exc)[-600:]}")
    finally:
        svc.terminate()

    results["ok"] = ok
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    os.sync()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
