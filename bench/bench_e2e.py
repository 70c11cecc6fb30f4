#!/usr/bin/env python
"""End to end: one speech clip on a template video, from SubmitJob to the finished MP4, split by stage.

Builds the inputs in a temp dir, starts every service as a process (services.local.LocalCluster,
the same processes and flags as `python -m services.local`), then through the public gRPC API:

1. CreateAvatar with a template video (timed on its own: decode + face detection of every frame).
   The template is samples/avatar.jpg placed in a --width x --height frame on a plain gradient and
   swaying a few pixels per frame (so every frame is different), --template-seconds long at --fps,
   encoded with services.render.mp4.Mp4Writer. The job's frames loop over it.
2. SubmitJob with --audio-seconds of speech: samples/speech.wav decoded (resampled to --audio-rate
   with services.media.audio.decode_audio), repeated to length and written as a 16-bit WAV.
3. WatchJob until it is finished; "SubmitJob -> MP4 ready" is the client's wall time from sending
   SubmitJob to the SUCCEEDED event (queueing included). Then DownloadOutput, and probe_media checks
   the MP4 (H.264 + AAC, frame count, size).

Prints a markdown table: audio seconds, frames, resolution, total seconds, real-time factor, and the
job's own per-stage split (Job.stage_seconds; the stages stream, so the parts overlap and do not add
up to the total). --out writes everything as JSON.

Throughput (--jobs N, --concurrency C, default C = N): after the warm-up, N jobs of the same avatar and
audio, at most C in flight (one client thread per slot, each SubmitJob then WatchJob). Every job must
succeed; the first submitted one is downloaded and probed and fills the single-job rows above. Adds
wall seconds from the first SubmitJob to the last job finished, jobs/minute, audio seconds rendered per
wall second and per-job SubmitJob -> MP4 p50/max (result["jobs"] in the JSON). Render workers
(--workers, default one per usable CPU) claim the jobs' segments; --worker-counts 16,8,4,2,1 runs
the batch once per count (workers beyond the count are stopped between batches), so the scaling
is visible. GPU utilisation is sampled with nvidia-smi during each measured run (the GPUs in --gpus).
With --gpus 0,1 (one lipsync and one superres replica per listed GPU; --replicas overrides the count)
this is the "jobs per minute on two GPUs" number; --pin-cores all spreads the render workers over
disjoint core sets (services/local/affinity.py; off by default, docs/decisions.md).

Weights (speed does not depend on the values):
* lipsync: a seeded synthetic Wav2Lip checkpoint (services.inference.checkpoints.seeded_state_dict)
  unless --checkpoint is given; --procedural runs the weight-free stand-in model instead.
* superres: a seeded realesr-general-x4v3 (SRVGGNetCompact, 32 convs, x4) in Real-ESRGAN's file
  format ({"params": ...}) unless --sr-checkpoint is given; --no-sr-weights uses the Lanczos fallback.
  --super-resolution off skips the stage (the lipsync stage then resizes its faces itself).
* --model musetalk: the avatar is made for the 256 px tier and the lipsync-musetalk stage (--replicas
  of it) renders its faces, from seeded checkpoints in the public formats (services/lipsync/musetalk/seeded.py;
  `--tiny`: narrow networks a CPU runs) unless --procedural (the weight-free musetalk-standin).

Examples:
    # CPU smoke (about a minute on 2 cores)
    python bench/bench_e2e.py --device cpu --audio-seconds 4 --width 640 --height 360 --template-seconds 2 \\
        --procedural --super-resolution off
    # the GPU issue's case: 60 s of speech on a 720p 25-fps template
    python bench/bench_e2e.py --device cuda --out var/bench/e2e-gpu.json
    # jobs per minute on two GPUs: 8 jobs, 4 in flight, after a warm-up job
    python bench/bench_e2e.py --device cuda --gpus 0,1 --warmup-seconds 5 --jobs 8 --concurrency 4

    python bench/bench_e2e.py --device cuda --replicas 2 --gpus 0,1 --warmup-seconds 5 --jobs 8 --concurrency 4
    # the 256 px tier's case: a 60 s clip on a 720p template (seeded MuseTalk networks on the GPU)
    python bench/bench_e2e.py --model musetalk --device cuda --super-resolution off --out var/bench/e2e-musetalk.json
    # the render-workers issue's case: 16 concurrent 30 s jobs at 720p with SR, 16..1 workers
    python bench/bench_e2e.py --device cuda --audio-seconds 30 --jobs 16 --worker-counts 16,8,4,2,1
"""

from __future__ import annotations

import argparse
import datetime as _dt
import io
import json
import math
import platform
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
import wave
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING

REPO_ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np

from services.local.affinity import add_placement_args, plan_from_args, replicas_for, validate_placement_args

if TYPE_CHECKING:
    from services.gateway.client import LiplineClient

SAMPLES = REPO_ROOT / "samples"
STAGE_ORDER = ("audio", "submit", "aac", "lipsync", "superres", "composite", "encode", "join", "total")
STAGE_NOTES = {
    "audio": "SubmitJob: the audio stage decodes (the checks) and makes the mel windows (start to last window)",
    "submit": "SubmitJob in all, before the job exists (the windows stored per segment)",
    "aac": "the job's audio task: the AAC track, on one worker beside the segments",
    "lipsync": "Generate calls, summed over segments",
    "superres": "Upscale calls, summed over segments",
    "composite": "blending the face into cached I420 frames, summed over segments",
    "encode": "x264, summed over segments",
    "join": "the join: stream copy of the segments and the AAC track",
    "total": "SubmitJob returned -> MP4 in place",
}


# --------------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------------


def build_template(path: Path, width: int, height: int, fps: float, seconds: float, crf: int = 18) -> int:
    """samples/avatar.jpg on a gradient, swaying slightly, as an H.264 MP4; returns the frame count."""
    import cv2

    from services.render.mp4 import Mp4Writer

    face = cv2.imread(str(SAMPLES / "avatar.jpg"))
    if face is None:
        raise SystemExit(f"cannot read {SAMPLES / 'avatar.jpg'}")
    side = min(round(0.8 * height), round(0.8 * width)) // 2 * 2
    face = cv2.resize(face, (side, side), interpolation=cv2.INTER_AREA)
    # A vertical grey-blue gradient: plain enough not to look like a face to the detector.
    ramp = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    top, bottom = np.array([70, 60, 50], np.float32), np.array([150, 130, 110], np.float32)
    background = np.broadcast_to(top + (bottom - top) * ramp, (height, width, 3)).astype(np.uint8)
    frames = max(1, round(seconds * fps))
    x0, y0 = (width - side) // 2, (height - side) // 2
    amp_x, amp_y = max(2, width // 200), max(1, height // 240)  # 6 x 3 px at 1280x720
    with Mp4Writer(path, width, height, fps, None, 16_000, crf=crf) as writer:
        for i in range(frames):
            t = i / fps
            dx = round(amp_x * math.sin(2 * math.pi * t / 3.0))
            dy = round(amp_y * math.sin(2 * math.pi * t / 2.0))
            x, y = min(max(x0 + dx, 0), width - side), min(max(y0 + dy, 0), height - side)
            frame = background.copy()
            frame[y : y + side, x : x + side] = face
            writer.write(frame)
    return frames


def build_speech(seconds: float, rate: int) -> bytes:
    """samples/speech.wav resampled to `rate`, repeated to `seconds`, as a mono 16-bit WAV file."""
    from services.media.audio import decode_audio

    clip = decode_audio((SAMPLES / "speech.wav").read_bytes(), rate)
    total = round(seconds * rate)
    pcm = np.tile(clip, -(-total // len(clip)))[:total]
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(pcm, -1.0, 1.0) * 32767).round().astype("<i2").tobytes())
    return out.getvalue()


# --------------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------------


def environment(device: str) -> dict:
    from services.render.encoder_threads import usable_cpus

    info: dict = {"python": platform.python_version(), "machine": platform.machine(), "cpus": usable_cpus()}
    try:
        import torch

        info["torch"] = torch.__version__
        if device != "cpu" and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def check_detector() -> None:
    """CreateAvatar needs the lipsync stage's Haar detector; OpenCV 5 builds lack cv2.CascadeClassifier."""
    import cv2

    if not hasattr(cv2, "CascadeClassifier"):
        raise SystemExit(
            f"OpenCV {cv2.__version__} has no cv2.CascadeClassifier: the lipsync stage cannot detect the template's faces (install opencv-python-headless 4.x)"
        )


def stage_args(args: argparse.Namespace, workdir: Path) -> dict[str, list[str]]:
    lipsync = [f"--device={args.device}", f"--log-level={args.log_level}"]
    if args.checkpoint:
        lipsync.append(f"--checkpoint={args.checkpoint}")
    elif not args.procedural:
        path = workdir / "wav2lip-seeded.pth"
        from bench.bench_lipsync_grpc import write_seeded_checkpoint

        write_seeded_checkpoint(path)
        lipsync.append(f"--checkpoint={path}")
    superres = [f"--device={args.device}", f"--log-level={args.log_level}", "--model=realesr-general-x4v3"]
    if args.sr_checkpoint:
        superres.append(f"--checkpoint={args.sr_checkpoint}")
    elif not args.no_sr_weights and args.super_resolution == "on":
        path = workdir / "realesr-general-x4v3-seeded.pth"
        from bench.bench_superres_grpc import write_seeded_checkpoint as write_seeded_sr

        write_seeded_sr(path, "realesr-general-x4v3")
        superres.append(f"--checkpoint={path}")
    stages = {}
    if args.model == "musetalk":
        musetalk = [f"--device={args.device}", f"--log-level={args.log_level}"]
        if not args.procedural:
            from services.lipsync.musetalk.seeded import given_or_seeded_networks

            paths = given_or_seeded_networks(args.musetalk_dir, workdir / "musetalk-models", small=args.tiny)
            musetalk += [f"--{name.replace('_', '-')}={path}" for name, path in paths.items()]
        stages["lipsync-musetalk"] = musetalk + shlex.split(args.musetalk_flags)
    return {
        **stages,
        "audio": [f"--log-level={args.log_level}", *shlex.split(args.audio_flags)],
        "lipsync": lipsync + shlex.split(args.lipsync_flags),
        "superres": superres + shlex.split(args.superres_flags),
        "gateway": [
            f"--log-level={args.log_level}",
            f"--segment-seconds={args.segment_seconds}",
            *shlex.split(args.gateway_flags),
        ],
        "render": [f"--log-level={args.log_level}", f"--x264-preset={args.preset}", *shlex.split(args.render_flags)],
    }


def run(args: argparse.Namespace, workdir: Path) -> dict:
    from lipline.v1 import gateway_pb2
    from services.gateway.client import LiplineClient, progress_printer
    from services.local.cluster import LocalCluster
    from services.media.probe import probe_media

    result: dict = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "environment": environment(args.device),
    }
    t = time.perf_counter()
    template = workdir / "template.mp4"
    template_frames = build_template(template, args.width, args.height, args.fps, args.template_seconds)
    speech = build_speech(args.audio_seconds, args.audio_rate)
    result["inputs"] = {
        "template_frames": template_frames,
        "template_bytes": template.stat().st_size,
        "audio_bytes": len(speech),
        "build_seconds": time.perf_counter() - t,
    }
    log(
        f"inputs: {args.width}x{args.height} template, {template_frames} frames ({template.stat().st_size / 1e6:.2f} MB); "
        f"{args.audio_seconds:g} s WAV at {args.audio_rate} Hz ({len(speech) / 1e6:.2f} MB) "
        f"in {result['inputs']['build_seconds']:.1f} s"
    )

    extra = stage_args(args, workdir)
    result["stage_flags"] = extra
    t = time.perf_counter()
    counts = [int(c) for c in args.worker_counts.split(",")] if args.worker_counts else [args.workers]
    gpus, cores = plan_from_args(args.gpus, args.pin_cores, {"render": max(counts)})
    replicas = {
        "lipsync": replicas_for(args.replicas, gpus),
        "superres": replicas_for(args.replicas, gpus),
        "render": max(counts),
        "audio": args.audio_replicas,
        "lipsync-musetalk": replicas_for(args.replicas, gpus) if args.model == "musetalk" else 0,
    }
    result["placement"] = {"replicas": replicas, "gpus": gpus, "cores": cores}
    with LocalCluster(
        workdir / "cluster",
        extra_args=extra,
        start_timeout_s=args.startup_timeout,
        replicas=replicas,
        gpus=gpus,
        cores=cores,
    ) as cluster:
        result["startup_seconds"] = time.perf_counter() - t
        log(f"services SERVING after {result['startup_seconds']:.1f} s (logs in {workdir / 'cluster'})")
        try:
            with LiplineClient(cluster.gateway_address, timeout=args.timeout) as client:
                t = time.perf_counter()
                avatar = client.create_avatar(template.read_bytes(), name="bench-template", model=args.model)
                result["create_avatar_seconds"] = time.perf_counter() - t
                result["avatar"] = {
                    "id": avatar.id,
                    "frames": avatar.frame_count,
                    "faces_found": avatar.faces_found,
                    "width": avatar.width,
                    "height": avatar.height,
                    "fps": avatar.fps,
                }
                log(
                    f"CreateAvatar: {avatar.frame_count} frames, face in {avatar.faces_found}, {result['create_avatar_seconds']:.2f} s"
                )
                if avatar.faces_found < avatar.frame_count:
                    log(
                        f"warning: no face found in {avatar.frame_count - avatar.faces_found} template frames (those frames pass through unchanged)"
                    )

                sr = args.super_resolution == "on"
                if args.warmup_seconds > 0:
                    t = time.perf_counter()
                    warm = client.wait(
                        client.submit_job(
                            avatar.id,
                            build_speech(args.warmup_seconds, args.audio_rate),
                            super_resolution=sr,
                            crf=args.crf,
                        ).id
                    )
                    if warm.state != gateway_pb2.JOB_STATE_SUCCEEDED:
                        raise SystemExit(f"warm-up job failed: {warm.error}")
                    result["warmup_seconds"] = time.perf_counter() - t
                    log(f"warm-up job ({args.warmup_seconds:g} s of audio): {result['warmup_seconds']:.2f} s")

                if args.jobs == 1:
                    with GpuSampler(gpus) as gpu:
                        first = submit_and_wait(client, avatar.id, speech, sr, args.crf, progress_printer(log))
                    result["gpu_utilization"] = gpu.summary()
                else:
                    result["scaling"] = []
                    for workers in sorted(counts, reverse=True):
                        for name in cluster.replica_names("render")[workers:]:
                            cluster.terminate(name)  # idle between batches: no task to give back
                        cpu_before = process_cpu_seconds(cluster)
                        with GpuSampler(gpus) as gpu:
                            runs = run_jobs(client, avatar.id, speech, sr, args)
                        cpu = cpu_by_service(cpu_before, process_cpu_seconds(cluster))
                        summary = {
                            "workers": workers,
                            **summarize_jobs(runs, args.concurrency),
                            "gpu_utilization": gpu.summary(),
                            "cpu_seconds_by_service": cpu,
                        }
                        log("  CPU seconds by service: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.items())))
                        result["scaling"].append(summary)
                        log(
                            f"{workers} render workers: {summary['jobs_per_minute']:.1f} jobs/min, "
                            f"GPU utilisation median {summary['gpu_utilization'].get('median', 'n/a')} %, "
                            f"host CPU {summary['gpu_utilization'].get('host_cpu') or 0:.0f} %"
                        )
                    result["jobs"] = result["scaling"][0]
                    first = runs[0]
                job = first["job"]
                result["submit_rpc_seconds"] = first["submit_rpc_seconds"]
                result["submit_to_mp4_seconds"] = first["submit_to_mp4_seconds"]
                if job.state != gateway_pb2.JOB_STATE_SUCCEEDED:
                    raise SystemExit(f"job {gateway_pb2.JobState.Name(job.state)}: {job.error}")

                output = workdir / "output.mp4"
                t = time.perf_counter()
                client.download(job.id, output)
                result["download_seconds"] = time.perf_counter() - t
        except BaseException:
            for name, proc in cluster.processes.items():
                print(f"----- {name} log tail -----\n{proc.log()[-3000:]}", file=sys.stderr)
            raise

    info = probe_media(output)
    expected = round(job.audio_seconds * args.fps)
    problems = []
    if (info["video_codec"], info["audio_codec"]) != ("h264", "aac"):
        problems.append(f"codecs {info['video_codec']} + {info['audio_codec']}, expected h264 + aac")
    if info["frames"] != job.total_frames or abs(info["frames"] - expected) > 1:
        problems.append(f"{info['frames']} frames decoded, job says {job.total_frames}, audio implies {expected}")
    if (info["width"], info["height"]) != (args.width, args.height):
        problems.append(f"size {info['width']}x{info['height']}, expected {args.width}x{args.height}")
    result["mp4"] = {**info, "bytes": output.stat().st_size, "problems": problems}
    result["job"] = {
        "id": job.id,
        "audio_seconds": job.audio_seconds,
        "frames": job.total_frames,
        "elapsed_seconds": job.elapsed_seconds,
        "realtime_factor": job.realtime_factor,
        "models": [f"{m.name} ({m.backend}, {m.precision})" for m in job.models],
        "stage_seconds": dict(job.stage_seconds),
    }
    result["realtime_factor"] = job.audio_seconds / result["submit_to_mp4_seconds"]
    return result


def process_cpu_seconds(cluster) -> dict[str, float]:
    """CPU seconds (user + system, all threads) of each live service process so far, its live child
    processes included (the audio stage extracts in children), from /proc."""
    import os

    tick = os.sysconf("SC_CLK_TCK")

    def tree(pid: int) -> list[int]:
        children: list[int] = []
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            children += [int(c) for c in task.read_text().split()]
        return [pid] + [p for c in children for p in tree(c)]

    out = {}
    for name, proc in cluster.processes.items():
        seconds = 0.0
        try:
            pids = tree(proc.process.pid)
        except OSError:
            continue
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            seconds += (float(fields[11]) + float(fields[12])) / tick
        out[name] = seconds
    return out


def cpu_by_service(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds spent between two snapshots, summed per service (render-3 counts as render)."""
    groups: dict[str, float] = {}
    for name, seconds in after.items():
        service = name.split("-", 1)[0]
        groups[service] = groups.get(service, 0.0) + seconds - before.get(name, 0.0)
    return groups


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat (Linux)."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


class GpuSampler:
    """GPU utilisation (nvidia-smi, every 200 ms; the GPUs given, else all, averaged) while a block runs,
    and the host's CPU utilisation over the block (/proc/stat); the GPU part is empty without a GPU."""

    def __init__(self, gpus: Sequence[str] = ()) -> None:
        self.gpus = list(dict.fromkeys(gpus))  # --gpus 0,0: GPU 0 once

    def __enter__(self) -> GpuSampler:
        import subprocess

        self._cpu_start = _cpu_times()
        self.samples: list[float] = []
        self._proc = None
        if shutil.which("nvidia-smi"):
            self._proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"]
                + ([f"--id={','.join(self.gpus)}"] if self.gpus else []),
                stdout=subprocess.PIPE,
                text=True,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        busy, total = (b - a for a, b in zip(self._cpu_start, _cpu_times()))
        self.cpu = 100.0 * busy / total if total else None
        if self._proc is None:
            return
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=10)
        values = [float(v) for v in out.split() if v.strip().replace(".", "", 1).isdigit()]
        self.samples = values

    def summary(self) -> dict:
        if not self.samples:
            return {"host_cpu": self.cpu}
        ordered = sorted(self.samples)
        return {
            "host_cpu": self.cpu,
            "samples": len(ordered),
            "median": statistics.median(ordered),
            "p90": ordered[int(0.9 * (len(ordered) - 1))],
            "mean": statistics.fmean(ordered),
        }


def submit_and_wait(
    client: LiplineClient, avatar_id: str, speech: bytes, sr: bool, crf: int, on_event: Callable | None = None
) -> dict:
    """One job, SubmitJob to its final WatchJob event, timed on the client (queueing in the gateway included)."""
    submitted_at = time.perf_counter()
    submitted = client.submit_job(avatar_id, speech, super_resolution=sr, crf=crf)
    submit_rpc = time.perf_counter() - submitted_at
    job = client.wait(submitted.id, on_event)
    finished_at = time.perf_counter()
    return {
        "job": job,
        "submit_rpc_seconds": submit_rpc,
        "submit_to_mp4_seconds": finished_at - submitted_at,
        "submitted_at": submitted_at,
        "finished_at": finished_at,
    }


def run_jobs(client: LiplineClient, avatar_id: str, speech: bytes, sr: bool, args: argparse.Namespace) -> list[dict]:
    """--jobs jobs, at most --concurrency in flight; returns their runs in submission order.

    The client's calls block, and a gRPC channel is safe to share between threads, so a pool of
    --concurrency threads over one client keeps exactly that many jobs in flight. One line per
    finished job (not the per-job progress printer: N of them would interleave unreadably).
    """
    from lipline.v1 import gateway_pb2

    n = args.jobs
    log(f"{n} jobs, at most {args.concurrency} in flight")
    runs: list[dict | None] = [None] * n
    with ThreadPoolExecutor(max_workers=args.concurrency, thread_name_prefix="job") as pool:
        futures = {pool.submit(submit_and_wait, client, avatar_id, speech, sr, args.crf): i for i in range(n)}
        try:
            for done, future in enumerate(as_completed(futures), 1):
                i, run_ = futures[future], future.result()
                runs[i] = run_
                job = run_["job"]
                log(
                    f"  [{done:>3}/{n} done] job {i + 1:<3} {gateway_pb2.JobState.Name(job.state):20s} "
                    f"SubmitJob -> MP4 {run_['submit_to_mp4_seconds']:6.1f} s  gateway elapsed {job.elapsed_seconds:6.1f} s"
                )
        except BaseException:
            for future in futures:
                future.cancel()  # the ones not started yet; those in flight run out
            raise
    failed = [
        f"job {i + 1} ({r['job'].id}) {gateway_pb2.JobState.Name(r['job'].state)}: {r['job'].error}"
        for i, r in enumerate(runs)
        if r["job"].state != gateway_pb2.JOB_STATE_SUCCEEDED
    ]
    if failed:
        raise SystemExit(f"{len(failed)} of {n} jobs failed:\n" + "\n".join(failed))
    return runs


def summarize_jobs(runs: list[dict], concurrency: int) -> dict:
    """Throughput over the whole batch: the wall clock runs from the first SubmitJob to the last job finished."""
    wall = max(r["finished_at"] for r in runs) - min(r["submitted_at"] for r in runs)
    latencies = [r["submit_to_mp4_seconds"] for r in runs]
    audio = sum(r["job"].audio_seconds for r in runs)
    return {
        "count": len(runs),
        "concurrency": concurrency,
        "wall_seconds": wall,
        "jobs_per_minute": len(runs) / wall * 60,
        "audio_seconds_per_wall_second": audio / wall,
        "frames_per_second": sum(r["job"].total_frames for r in runs) / wall,
        "submit_to_mp4_p50_seconds": statistics.median(latencies),
        "submit_to_mp4_max_seconds": max(latencies),
        "submit_to_mp4_seconds": latencies,
        # SubmitJob's own latency per job: under a burst, how long the job waits to exist (the fill).
        "submit_rpc_seconds": [r["submit_rpc_seconds"] for r in runs],
        "elapsed_seconds": [r["job"].elapsed_seconds for r in runs],
        "ids": [r["job"].id for r in runs],
    }


# --------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------


def table(result: dict) -> str:
    job, mp4, args = result["job"], result["mp4"], result["args"]
    frames = job["frames"]
    total = result["submit_to_mp4_seconds"]
    batch = result.get("jobs")
    of_first = f"job 1 of {batch['count']}" if batch else ""
    rows = [
        ("audio seconds", f"{job['audio_seconds']:.2f}"),
        ("frames", f"{frames}"),
        ("resolution", f"{mp4['width']}x{mp4['height']} @ {mp4['fps']:g} fps"),
        ("template", f"{result['avatar']['frames']} frames, face in {result['avatar']['faces_found']}"),
        ("models", ", ".join(job["models"]) + ("" if args["super_resolution"] == "on" else " (superres off)")),
        ("services start-up s", f"{result['startup_seconds']:.2f}"),
        ("CreateAvatar s", f"{result['create_avatar_seconds']:.2f}"),
        (f"**SubmitJob -> MP4 ready s**{f' ({of_first})' if batch else ''}", f"**{total:.2f}**"),
        ("**real-time factor** (audio s / that)", f"**{result['realtime_factor']:.2f}x**"),
        ("frames/s", f"{frames / total:.1f}"),
        ("job elapsed s (gateway)", f"{job['elapsed_seconds']:.2f}"),
        ("DownloadOutput s", f"{result['download_seconds']:.2f}"),
        (
            "MP4",
            f"{mp4['video_codec']} + {mp4['audio_codec']}, {mp4['frames']} frames, {mp4['bytes'] / 1e6:.2f} MB"
            + (f"; PROBLEMS: {'; '.join(mp4['problems'])}" if mp4["problems"] else "; ok"),
        ),
    ]
    if "warmup_seconds" in result:
        rows.insert(7, ("warm-up job s", f"{result['warmup_seconds']:.2f}"))
    if batch:
        rows += [
            ("jobs", f"{batch['count']}, at most {batch['concurrency']} in flight"),
            ("**jobs wall s** (first SubmitJob -> last finished)", f"**{batch['wall_seconds']:.2f}**"),
            ("**jobs/minute**", f"**{batch['jobs_per_minute']:.2f}**"),
            ("audio s rendered / wall s", f"{batch['audio_seconds_per_wall_second']:.2f}"),
            (
                "per-job SubmitJob -> MP4 s, p50 / max",
                f"{batch['submit_to_mp4_p50_seconds']:.2f} / {batch['submit_to_mp4_max_seconds']:.2f}",
            ),
            (
                "per-job SubmitJob RPC s (the burst's fill), min / max",
                f"{min(batch['submit_rpc_seconds']):.2f} / {max(batch['submit_rpc_seconds']):.2f}",
            ),
        ]
    for run_ in result.get("scaling", []):
        gpu = run_["gpu_utilization"]
        cpu = gpu.get("host_cpu")
        rows.append(
            (
                f"{run_['workers']} render workers: jobs/min, GPU util median / p90 %, host CPU %",
                f"{run_['jobs_per_minute']:.1f}, {gpu.get('median', '-')} / {gpu.get('p90', '-')}, {'-' if cpu is None else f'{cpu:.0f}'}",
            )
        )
    if result.get("gpu_utilization"):
        gpu = result["gpu_utilization"]
        cpu = gpu.get("host_cpu")
        rows.append(
            (
                "GPU utilisation median / p90 %, host CPU % (this job)",
                f"{gpu.get('median', '-')} / {gpu.get('p90', '-')}, {'-' if cpu is None else f'{cpu:.0f}'}",
            )
        )
    lines = ["| | |", "|---|---:|", *(f"| {k} | {v} |" for k, v in rows), ""]
    stages = job["stage_seconds"]
    render_total = stages.get("total") or total
    lines += [
        f"| stage (Job.stage_seconds{f', {of_first}' if batch else ''}) | seconds | of job total | ms/frame | what |",
        "|---|---:|---:|---:|---|",
    ]
    for name in [*STAGE_ORDER, *sorted(set(stages) - set(STAGE_ORDER))]:
        if name not in stages:
            continue
        v = stages[name]
        per_frame = f"{1000 * v / frames:.1f}" if frames and name not in ("first_frame", "total") else ""
        lines.append(
            f"| {name} | {v:.2f} | {100 * v / render_total:.0f}% | {per_frame} | {STAGE_NOTES.get(name, '')} |"
        )
    lines.append("")
    lines.append(
        "Segments run on several render workers at once: lipsync, superres, composite and encode are sums over segments, so they can exceed the total."
    )
    return "\n".join(lines)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="lipsync and superres --device")
    p.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="replicas of lipsync and superres (the gateway balances; default: one per --gpus entry, else 1)",
    )
    p.add_argument(
        "--audio-replicas",
        type=int,
        default=1,
        help="replicas of the audio stage (a CPU stage: one Python process each, as a pod would be)",
    )
    add_placement_args(p, "render workers")
    p.add_argument("--audio-seconds", type=float, default=60.0, help="length of the speech clip")
    p.add_argument("--audio-rate", type=int, default=16_000, help="sample rate of the uploaded WAV")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--fps", type=float, default=25.0)
    p.add_argument("--template-seconds", type=float, default=10.0, help="length of the template video")
    p.add_argument("--checkpoint", default="", help="lipsync wav2lip.pth; default: a seeded synthetic one")
    p.add_argument("--procedural", action="store_true", help="lipsync without weights (the procedural stand-in)")
    p.add_argument("--sr-checkpoint", default="", help="Real-ESRGAN realesr-general-x4v3 .pth; default: seeded")
    p.add_argument("--no-sr-weights", action="store_true", help="superres without weights (Lanczos fallback)")
    p.add_argument("--super-resolution", choices=["on", "off"], default="on", help="JobOptions.super_resolution")
    p.add_argument("--crf", type=int, default=0, help="JobOptions.crf (0: the gateway's default, 20)")
    p.add_argument("--warmup-seconds", type=float, default=0.0, help="run an unmeasured job of this length first")
    p.add_argument("--jobs", type=int, default=1, help="measured jobs (same avatar and audio); >1 adds jobs/minute")
    p.add_argument("--concurrency", type=int, default=0, help="most jobs in flight at once (default: --jobs)")
    p.add_argument("--model", default="wav2lip", choices=["wav2lip", "musetalk"], help="the avatar's tier")
    p.add_argument("--tiny", action="store_true", help="musetalk: narrow seeded networks (a CPU's smoke run)")
    p.add_argument("--musetalk-dir", default="", help="musetalk: a models folder in the public layout")
    p.add_argument("--musetalk-flags", default="", help="more lipsync-musetalk flags, e.g. '--max-batch=64'")
    p.add_argument("--lipsync-flags", default="", help="more lipsync flags, e.g. '--backend=compile --max-batch=256'")
    p.add_argument("--superres-flags", default="", help="more superres flags")
    p.add_argument("--audio-flags", default="", help="more audio flags")
    p.add_argument("--gateway-flags", default="", help="more gateway flags")
    p.add_argument("--render-flags", default="", help="more render worker flags")
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="render worker processes (default: the usable CPUs, or the --pin-cores ones; at least 2)",
    )
    p.add_argument(
        "--worker-counts", default="", help="with --jobs > 1: e.g. 16,8,4,2,1 runs the batch once per worker count"
    )
    p.add_argument("--segment-seconds", type=float, default=2.0, help="gateway --segment-seconds")
    p.add_argument("--preset", default="veryfast", help="render workers' --x264-preset")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds for each service to be SERVING")
    p.add_argument("--timeout", type=float, default=3600.0, help="client deadline of each RPC")
    p.add_argument("--log-level", default="INFO", help="services' log level")
    p.add_argument(
        "--workdir", type=Path, default=None, help="keep inputs, logs and the MP4 here (default: a temp dir)"
    )
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    if args.width % 2 or args.height % 2:
        p.error("--width and --height must be even (H.264 yuv420p)")
    if args.checkpoint and args.procedural:
        p.error("--checkpoint and --procedural exclude each other")
    if args.jobs < 1 or args.concurrency < 0:
        p.error("--jobs must be at least 1 and --concurrency at least 0")
    args.concurrency = min(args.concurrency or args.jobs, args.jobs)
    pinned = validate_placement_args(p, args)
    if not args.workers:  # one per core the workers may use
        from services.render.encoder_threads import usable_cpus

        args.workers = max(2, len(pinned) or usable_cpus())
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_detector()
    # `timeout` sends SIGTERM: unwind, so that the services are stopped and nothing holds the GPU after us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lipline-e2e-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        result = run(args, workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(table(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        log(f"wrote {args.out}")
    return 1 if result["mp4"]["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
