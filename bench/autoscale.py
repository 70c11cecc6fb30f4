"""The autoscaling loop on real services: the chart's own HPA rules driving real replicas under load.

Starts the local services (services/local: stages, gateway, render workers, live workers) with
`file://` address lists for discovery, a real Prometheus scraping them as the chart's ServiceMonitor
says (services/local/prometheus.py, the chart's rules loaded), and an HPA controller per scaled
stage (services/local/autoscaler.py) that evaluates the chart's rendered HPAs or KEDA ScaledObjects
(`helm template`; `--set` passes values, e.g. keda.enabled=true) every sync period and starts or
stops replica processes (SIGTERM, so they drain). Meanwhile a load profile runs: idle, a burst of
jobs (and live sessions), a plateau of jobs at a steady rate, idle until every scaled stage is back
at its minimum (or --max-idle-s).

Writes --out JSON (every sync: per stage replicas desired / current / ready, each metric against its
target; per job its submit and end times, state and queue wait; the figures) and, where matplotlib
imports, a PNG plot beside it. `--time-scale 10` divides every window, period, the sync period and
the scrape interval by 10 (the CI test's way to show a 5-minute scale-down in 30 s); 1 is real time.
`--gpus 0,1,2,3` places the GPU stages' replicas one per listed GPU (a replica the HPA adds takes the
lowest GPU slot free, services/local/affinity.py); `--pin-cores` gives each render and live worker,
up to its HPA's maximum, cores of its own.

CPU smoke (what tests/integration/test_autoscale.py runs):
    .venv/bin/python bench/autoscale.py --device cpu --time-scale 10 --scale render \\
        --set stages.render.autoscaling.maxReplicas=4 --burst-jobs 10 --out var/bench/autoscale-cpu.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import grpc

from lipline.v1 import gateway_pb2
from services.gateway.client import LiplineClient
from services.gateway.live_client import run_session
from services.local.affinity import add_placement_args, plan_from_args, validate_placement_args
from services.local.autoscaler import Autoscaler
from services.local.chart_scaling import (
    HPA_SYNC_PERIOD_S,
    load_manifests,
    render_chart,
    save_manifests,
    scaling_objects,
    scrape_interval_s,
)
from services.local.cluster import LocalCluster
from services.local.prometheus import PrometheusServer

CHART = REPO_ROOT / "helm" / "lipline"
RULES = CHART / "files" / "prometheus-rules.yaml"
SAMPLES = REPO_ROOT / "samples"
NAMESPACE, RELEASE = "lipline-local", "lipline"


@dataclass
class JobRecord:
    submitted: float
    job_id: str = ""
    ended: float = 0.0
    state: str = "lost"  # until an end is seen
    error: str = ""


@dataclass
class SessionRecord:
    started: float
    ended: float = 0.0
    ok: bool = False
    error: str = ""
    latency_p95_s: float = 0.0
    utterances: int = 0
    #: CreateSession answered RESOURCE_EXHAUSTED (every live worker full): retried after a second
    refused: int = 0


@dataclass
class Load:
    """The load profile's clients: jobs through SubmitJob/WatchJob, sessions through Converse."""

    client: LiplineClient
    avatar_id: str
    speech: bytes
    super_resolution: bool
    jobs: list[JobRecord] = field(default_factory=list)
    sessions: list[SessionRecord] = field(default_factory=list)
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(max_workers=64))
    futures: list[Future] = field(default_factory=list)

    def submit_job(self, t0: float) -> None:
        record = JobRecord(time.monotonic() - t0)
        self.jobs.append(record)
        self.futures.append(self.pool.submit(self._job, record, t0))

    def _job(self, record: JobRecord, t0: float) -> None:
        try:
            job = self.client.submit_job(self.avatar_id, self.speech, super_resolution=self.super_resolution)
            record.job_id = job.id
            job = self.client.wait(job.id)
            record.state = gateway_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_").lower()
            record.error = job.error
        except grpc.RpcError as exc:
            record.state, record.error = "failed", f"{exc.code().name}: {exc.details()}"
        record.ended = time.monotonic() - t0

    def start_session(self, t0: float, seconds: float) -> None:
        record = SessionRecord(time.monotonic() - t0)
        self.sessions.append(record)
        self.futures.append(self.pool.submit(self._session, record, t0, seconds))

    def _session(self, record: SessionRecord, t0: float, seconds: float) -> None:
        """Utterances of the sample one after another for `seconds`, each its own session; a refused
        CreateSession (the workers are full until the HPA adds one) is retried, as a client would."""
        until = time.monotonic() + seconds
        try:
            while time.monotonic() < until:
                try:
                    _, recorder = run_session(self.client, self.avatar_id, self.speech, write=lambda _: None)
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise
                    record.refused += 1
                    time.sleep(1.0)
                    continue
                record.utterances += 1
                lat = sorted(recorder.latencies())
                record.latency_p95_s = max(record.latency_p95_s, lat[int(0.95 * (len(lat) - 1))] if lat else 0.0)
            record.ok = True
        except grpc.RpcError as exc:
            record.error = f"{exc.code().name}: {exc.details()}"
        record.ended = time.monotonic() - t0

    def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for f in self.futures:
            try:
                f.result(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
        self.pool.shutdown(wait=False, cancel_futures=True)


def stage_args(args: argparse.Namespace, workdir: Path) -> dict[str, list[str]]:
    """Each stage's flags. On a GPU without checkpoints the models get seeded weights (the GPU work is
    the real network's; the procedural stand-in and Lanczos would leave the GPU idle and its metric 0)."""
    lipsync, superres = [f"--device={args.device}"], [f"--device={args.device}", "--model=realesr-general-x4v3"]
    gpu = args.device != "cpu"
    if args.checkpoint:
        lipsync.append(f"--checkpoint={args.checkpoint}")
    elif gpu:
        from bench.bench_lipsync_grpc import write_seeded_checkpoint

        workdir.mkdir(parents=True, exist_ok=True)
        write_seeded_checkpoint(workdir / "wav2lip-seeded.pth")
        lipsync.append(f"--checkpoint={workdir / 'wav2lip-seeded.pth'}")
    if args.sr_checkpoint:
        superres.append(f"--checkpoint={args.sr_checkpoint}")
    elif gpu:
        from bench.bench_superres_grpc import write_seeded_checkpoint as write_seeded_sr

        workdir.mkdir(parents=True, exist_ok=True)
        write_seeded_sr(workdir / "sr-seeded.pth", "realesr-general-x4v3")
        superres.append(f"--checkpoint={workdir / 'sr-seeded.pth'}")
    return {
        "lipsync": lipsync,
        "superres": superres,
        "gateway": [f"--segment-seconds={args.segment_seconds}"],
        "live": [f"--max-sessions={args.max_sessions}"],
    }


def back_at_min(scaler: Autoscaler) -> bool:
    last = scaler.history[-1]["stages"] if scaler.history else {}
    return bool(last) and all(
        s["current"] == scaler.objects[name].min_replicas and s["terminating"] == 0 for name, s in last.items()
    )


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    scale = args.time_scale
    docs = (
        load_manifests(args.rendered)
        if args.rendered
        else render_chart(args.helm, CHART, RELEASE, NAMESPACE, args.set, json_values=args.set_json)
    )
    every = scaling_objects(docs, NAMESPACE, scale)
    unknown = set(args.scale) - set(every)
    if unknown:
        raise SystemExit(
            f"--scale {','.join(sorted(unknown))}: the chart has no autoscaling for it ({', '.join(every)})"
        )
    objects = {s: every[s] for s in args.scale}
    sync_s = HPA_SYNC_PERIOD_S / scale
    scrape_s = scrape_interval_s(docs) / scale
    replicas = {"render": 2, "live": 1 if args.sessions else 0}
    replicas.update({s: o.min_replicas for s, o in objects.items()})
    # --pin-cores: a core set per render and live worker the HPAs may run (their maximum), the rest shared.
    most = {s: objects[s].max_replicas if s in objects else replicas[s] for s in ("render", "live")}
    gpus, cores = plan_from_args(args.gpus, args.pin_cores, {s: n for s, n in most.items() if n})
    print(f"scaling {', '.join(objects)} every {sync_s:g} s (scrape {scrape_s:g} s, time scale {scale:g})", flush=True)
    for o in objects.values():
        metrics = ", ".join(f"{m.name} ({m.kind}) target {m.target:g}" for m in o.metrics)
        print(f"  {o.stage}: {o.kind} {o.min_replicas}-{o.max_replicas} on {metrics}", flush=True)
    cluster = LocalCluster(
        workdir / "cluster",
        extra_args=stage_args(args, workdir / "weights"),
        replicas=replicas,
        address_files=True,
        start_timeout_s=600,
        gpus=gpus,
        cores=cores,
    )
    prometheus = PrometheusServer(
        workdir / "prometheus", scrape_interval_s=scrape_s, rule_files=[RULES], binary=args.prometheus
    )
    with cluster, prometheus:
        t0, t0_wall = time.monotonic(), time.time()
        scaler = Autoscaler(
            cluster,
            prometheus,
            objects,
            namespace=NAMESPACE,
            release=RELEASE,
            sync_period_s=sync_s,
            clock=lambda: time.monotonic() - t0,
        )
        client = LiplineClient(cluster.gateway_address, timeout=args.job_timeout_s)
        avatar = client.create_avatar((SAMPLES / "avatar.jpg").read_bytes())
        load = Load(client, avatar.id, args.audio.read_bytes(), args.super_resolution)
        scaler.start()
        phases: list[dict[str, Any]] = []

        def phase(name: str) -> None:
            phases.append({"name": name, "t": time.monotonic() - t0})
            print(f"{phases[-1]['t']:7.1f} s  {name}", flush=True)

        stop_printing = threading.Event()

        def progress() -> None:
            while not stop_printing.wait(max(2.0, sync_s * 2)):
                if scaler.history:
                    rec = scaler.history[-1]
                    parts = [
                        f"{s}: {v['current']} (ready {v['ready']}) -> {v['desired']} "
                        + " ".join(f"{m['name']}={m['value']:.3g}" for m in v["metrics"] if m["value"] is not None)
                        for s, v in rec["stages"].items()
                    ]
                    done = sum(1 for j in load.jobs if j.ended)
                    print(f"{rec['t']:7.1f} s  {'; '.join(parts)}; jobs {done}/{len(load.jobs)}", flush=True)

        printer = threading.Thread(target=progress, daemon=True)
        printer.start()
        try:
            phase("idle")
            time.sleep(args.idle_s)
            phase("burst")
            for _ in range(args.sessions):
                load.start_session(t0, args.plateau_s + args.burst_s)
            for _ in range(args.burst_jobs):
                load.submit_job(t0)
            time.sleep(args.burst_s)
            phase("plateau")
            plateau_end = time.monotonic() + args.plateau_s
            while time.monotonic() < plateau_end:
                if args.plateau_jobs_per_s > 0:
                    load.submit_job(t0)
                time.sleep(1 / args.plateau_jobs_per_s if args.plateau_jobs_per_s > 0 else 1.0)
            phase("idle")
            idle_end = time.monotonic() + args.max_idle_s
            while time.monotonic() < idle_end:
                if (
                    all(j.ended for j in load.jobs)
                    and back_at_min(scaler)
                    and time.monotonic() > idle_end - args.max_idle_s + args.min_idle_s
                ):
                    break
                time.sleep(0.5)
            phase("end")
        finally:
            scaler.stop()
            stop_printing.set()
            load.wait(30)
            client.close()
        queue_waits = _queue_waits(prometheus, t0_wall)
        signals = _signals(prometheus, t0_wall)
    return report(args, scaler, load, phases, queue_waits, signals, sync_s, scrape_s)


def _queue_waits(prometheus: PrometheusServer, t0_wall: float) -> list[list[float]]:
    """p95 queue wait (creation to claim) over the run (s since its start, s), from the render workers' histogram."""
    end = time.time()
    rows = prometheus.query_range(
        f'histogram_quantile(0.95, sum by (le) (rate(lipline_queue_wait_seconds_bucket{{namespace="{NAMESPACE}"}}[10s])))',
        t0_wall,
        end,
        1.0,
    )
    return [[float(t) - t0_wall, float(v)] for t, v in rows[0]["values"]] if rows else []


# Both GPU-stage signals over the run, whichever one the HPAs scale on: a run on one of them shows
# what the other would have done (and where a target sits against what the host reaches).
SIGNALS = {
    "gpu_utilization_max": f'max(lipline_gpu_utilization_ratio{{namespace="{NAMESPACE}"}})',
    "batch_wait_mean_s": (
        f'sum by (stage) (rate(lipline_stage_queue_seconds_sum{{namespace="{NAMESPACE}"}}[10s]))'
        f' / clamp_min(sum by (stage) (rate(lipline_stage_queue_seconds_count{{namespace="{NAMESPACE}"}}[10s])), 1e-9)'
    ),
}


def _signals(prometheus: PrometheusServer, t0_wall: float) -> dict[str, dict[str, list[list[float]]]]:
    """Each SIGNALS series over the run ({name: {stage or "": [[s since start, value], ...]}})."""
    end = time.time()
    out: dict[str, dict[str, list[list[float]]]] = {}
    for name, expr in SIGNALS.items():
        rows = prometheus.query_range(expr, t0_wall, end, 1.0)
        out[name] = {
            r["metric"].get("stage", ""): [[float(t) - t0_wall, float(v)] for t, v in r["values"]] for r in rows
        }
    return out


def report(
    args: argparse.Namespace,
    scaler: Autoscaler,
    load: Load,
    phases: list[dict[str, Any]],
    queue_waits: list[list[float]],
    signals: dict[str, dict[str, list[list[float]]]],
    sync_s: float,
    scrape_s: float,
) -> dict[str, Any]:
    jobs = [asdict(j) for j in load.jobs]
    figures: dict[str, Any] = {
        "jobs_submitted": len(jobs),
        "jobs_succeeded": sum(1 for j in jobs if j["state"] == "succeeded"),
        "jobs_failed": sum(1 for j in jobs if j["state"] == "failed"),
        "jobs_lost": sum(1 for j in jobs if j["state"] not in ("succeeded", "failed")),
        "sessions": len(load.sessions),
        "sessions_failed": sum(1 for s in load.sessions if not s.ok),
        "sessions_refused": sum(s.refused for s in load.sessions),
        "replica_exits": {r.name: r.exit_code for r in scaler.gone},
    }
    burst = next((p["t"] for p in phases if p["name"] == "burst"), 0.0)
    for stage, obj in scaler.objects.items():
        series = [(h["t"], h["stages"][stage]) for h in scaler.history if stage in h["stages"]]
        peak = max((s["current"] for _, s in series), default=0)
        first_up = next((t for t, s in series if t >= burst and s["desired"] > obj.min_replicas), None)
        first_ready_up = next((t for t, s in series if t >= burst and s["ready"] > obj.min_replicas), None)
        back = next(
            (
                t
                for t, s in series
                if t > (first_up or 1e18) and s["current"] == obj.min_replicas and not s["terminating"]
            ),
            None,
        )
        changes = sum(1 for (_, a), (_, b) in zip(series, series[1:]) if a["desired"] != b["desired"])
        figures[stage] = {
            "min": obj.min_replicas,
            "max": obj.max_replicas,
            "peak_replicas": peak,
            "scale_up_decided_s": None if first_up is None else first_up - burst,
            "scale_up_ready_s": None if first_ready_up is None else first_ready_up - burst,
            "back_at_min_s": None if back is None else back - burst,
            "desired_changes": changes,
        }
    waits = [v for _, v in queue_waits if v == v]
    figures["peak_queue_wait_p95_s"] = max(waits, default=None)
    for name, series in signals.items():
        for stage, points in series.items():
            values = [v for _, v in points if v == v]
            figures[f"peak_{name}" + (f"_{stage}" if stage else "")] = max(values, default=None)
    result = {
        "command": " ".join(sys.argv),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "time_scale": args.time_scale,
        "sync_period_s": sync_s,
        "scrape_interval_s": scrape_s,
        "values": args.set + args.set_json,
        "objects": {s: {"kind": o.kind, "metrics": [asdict(m) for m in o.metrics]} for s, o in scaler.objects.items()},
        "phases": phases,
        "history": scaler.history,
        "jobs": jobs,
        "sessions": [asdict(s) for s in load.sessions],
        "queue_wait_p95": queue_waits,
        "signals": signals,
        "figures": figures,
    }
    return result


def plot(result: dict[str, Any], path: Path) -> bool:
    """A PNG per component over time (replicas, metric vs target, jobs); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    stages = list(result["objects"])
    fig, axes = plt.subplots(len(stages) + 1, 2, figsize=(13, 3.2 * (len(stages) + 1)), squeeze=False)
    history = result["history"]
    for row, stage in enumerate(stages):
        ts = [h["t"] for h in history if stage in h["stages"]]
        rec = [h["stages"][stage] for h in history if stage in h["stages"]]
        ax = axes[row][0]
        ax.step(ts, [r["desired"] for r in rec], where="post", label="desired")
        ax.step(ts, [r["current"] for r in rec], where="post", label="replicas (not terminating)")
        ax.step(ts, [r["ready"] for r in rec], where="post", label="ready (SERVING)", linestyle="--")
        ax.set_title(f"{stage}: replicas")
        ax.set_ylabel("replicas")
        ax.legend(fontsize=7)
        ax = axes[row][1]
        for i, spec in enumerate(result["objects"][stage]["metrics"]):
            values = [r["metrics"][i]["value"] for r in rec]
            line = ax.plot(ts, [float("nan") if v is None else v / spec["target"] for v in values], label=spec["name"])
            ax.axhline(1.0, color=line[0].get_color(), linestyle=":", linewidth=0.8)
        ax.set_title(f"{stage}: metric / target (1 = at target; per pod for AverageValue)")
        ax.legend(fontsize=7)
    ax = axes[-1][0]
    jobs = result["jobs"]
    ends = sorted(j["ended"] for j in jobs if j["state"] == "succeeded")
    ax.step([0.0, *ends], range(len(ends) + 1), where="post", label="jobs finished")
    subs = sorted(j["submitted"] for j in jobs)
    ax.step([0.0, *subs], range(len(subs) + 1), where="post", label="jobs submitted")
    bad = sorted(j["ended"] or j["submitted"] for j in jobs if j["state"] != "succeeded")
    if bad:
        ax.plot(bad, range(1, len(bad) + 1), "rx", label="failed or lost")
    ax.set_title(f"jobs: {result['figures']['jobs_failed']} failed, {result['figures']['jobs_lost']} lost")
    ax.legend(fontsize=7)
    ax = axes[-1][1]
    qw = result["queue_wait_p95"]
    if qw:
        ax.plot([t for t, _ in qw], [v for _, v in qw], label="render queue wait p95 (creation to claim)")
    lat = [(s["ended"], s["latency_p95_s"]) for s in result["sessions"] if s["ended"]]
    if lat:
        ax.plot(*zip(*lat), "o", label="session frame latency p95")
    ax.set_title("queue wait / session latency (s)")
    ax.legend(fontsize=7)
    for a in axes.flat:
        a.set_xlabel("s since start")
        for p in result["phases"]:
            a.axvline(p["t"], color="grey", linewidth=0.5)
    fig.suptitle(f"lipline autoscaling, time scale {result['time_scale']:g} ({result['date']})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="lipsync and superres --device")
    p.add_argument("--checkpoint", default="", help="wav2lip.pth (default: the procedural stand-in)")
    p.add_argument("--sr-checkpoint", default="", help="Real-ESRGAN .pth (default: Lanczos)")
    p.add_argument(
        "--scale", default="render", help="comma-separated stages to autoscale (render,live,lipsync,superres,audio)"
    )
    add_placement_args(p, "render and live workers (one set per replica up to the HPA's maximum)")
    p.add_argument("--set", action="append", default=[], help="a chart value, as helm --set (repeatable)")
    p.add_argument(
        "--set-json", action="append", default=[], help="a chart value, as helm --set-json (a fraction: 0.2)"
    )
    p.add_argument(
        "--helm", default=shutil.which("helm", path=f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin") or "helm"
    )
    p.add_argument("--prometheus", default="prometheus", help="the prometheus binary")
    p.add_argument("--rendered", type=Path, default=None, help="the chart's objects from --render-only (no helm here)")
    p.add_argument(
        "--plot-only", type=Path, default=None, help="draw the PNG of a saved JSON (from a host without matplotlib)"
    )
    p.add_argument("--render-only", type=Path, default=None, help="write the rendered chart (with --set) as JSON, exit")
    p.add_argument("--time-scale", type=float, default=1.0, help="divide every window, period and interval by this")
    p.add_argument("--audio", type=Path, default=SAMPLES / "speech.wav", help="each job's speech")
    p.add_argument("--segment-seconds", type=float, default=0.8, help="the gateway's segment length")
    p.add_argument("--super-resolution", action="store_true", help="jobs use the superres stage")
    p.add_argument("--idle-s", type=float, default=5.0, help="idle before the burst")
    p.add_argument("--burst-jobs", type=int, default=10, help="jobs submitted at once")
    p.add_argument(
        "--sessions", type=int, default=0, help="live sessions opened with the burst, held through the plateau"
    )
    p.add_argument("--max-sessions", type=int, default=16, help="live workers' --max-sessions")
    p.add_argument("--burst-s", type=float, default=2.0, help="how long the burst phase lasts")
    p.add_argument("--plateau-s", type=float, default=15.0, help="the plateau's length")
    p.add_argument("--plateau-jobs-per-s", type=float, default=0.5, help="jobs per second during the plateau")
    p.add_argument("--min-idle-s", type=float, default=5.0, help="idle at least this long after the plateau")
    p.add_argument("--max-idle-s", type=float, default=120.0, help="idle at most this long waiting for the minimum")
    p.add_argument("--job-timeout-s", type=float, default=600.0)
    p.add_argument("--workdir", type=Path, default=None, help="logs and stores (default: a temporary folder)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "var" / "bench" / "autoscale.json")
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    args.scale = [s for s in args.scale.split(",") if s]
    validate_placement_args(p, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.plot_only:
        png = args.plot_only.with_suffix(".png")
        if not plot(json.loads(args.plot_only.read_text()), png):
            raise SystemExit("--plot-only needs matplotlib")
        print(f"wrote {png}")
        return 0
    if args.render_only:
        save_manifests(
            render_chart(args.helm, CHART, RELEASE, NAMESPACE, args.set, json_values=args.set_json), args.render_only
        )
        print(f"wrote {args.render_only}")
        return 0
    with tempfile.TemporaryDirectory(prefix="autoscale-") as tmp:
        workdir = args.workdir or Path(tmp)
        result = run(args, workdir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    png = args.out.with_suffix(".png")
    drew = plot(result, png)
    print(json.dumps(result["figures"], indent=1))
    print(f"wrote {args.out}" + (f" and {png}" if drew else " (no matplotlib: no plot)"))
    f = result["figures"]
    return 0 if f["jobs_failed"] == 0 and f["jobs_lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
