"""`python -m services.local`: the whole pipeline on this machine, from sample inputs to an MP4.

Starts the services as separate processes on 127.0.0.1 (CPU when there is no GPU): the audio,
lipsync and superres stages (with --musetalk the lipsync-musetalk stage too: the 256 px tier), the
gateway, two render workers and a live worker (live sessions), on
the embedded stores (an SQLite file and a folder under --workdir). Then registers the avatar (for the
tier `--model` names: `--model musetalk` renders the 256 px tier), submits the audio through the public
gRPC API, follows the job's progress, downloads the MP4 and checks it (H.264 + AAC, duration), and
shuts the services down with SIGTERM.

`python -m services.local serve` starts the same services and keeps them running (Ctrl-C stops
them), printing the gateway's address for a product backend or a developer to call (live sessions
too: `python -m services.gateway.client live --address ADDRESS --avatar ID speech.wav out.mp4`),
and the web page's URL (services/web: avatars, jobs and a live session from the microphone in a
browser; local mode's gateway checks no API keys, so the page asks for none).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from lipline.v1 import gateway_pb2
from services.gateway.client import LiplineClient, render_file
from services.local.cluster import REPO_ROOT, LocalCluster
from services.media.probe import probe_media
from services.serving.stages import DEFAULT_TIER, MUSETALK_TIER, tiers


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.local", description=__doc__.splitlines()[0])
    p.add_argument(
        "command",
        nargs="?",
        choices=["demo", "serve"],
        default="demo",
        help="demo: render the sample and stop (default); serve: keep the services running",
    )
    p.add_argument("--workers", type=int, default=2, help="render worker processes")
    p.add_argument(
        "--live-workers",
        type=int,
        default=None,
        help="live worker processes (live sessions; 0: none); default 1 for serve, 0 for demo (it renders a job only)",
    )
    p.add_argument("--gateway-port", type=int, default=0, help="serve: the gateway's port (0 = any free port)")
    p.add_argument(
        "--web-port", type=int, default=8080, help="serve: the web page's HTTP port (0 = any free port; -1 = no page)"
    )
    p.add_argument("--avatar", type=Path, default=REPO_ROOT / "samples" / "avatar.jpg", help="photo or video")
    p.add_argument("--audio", type=Path, default=REPO_ROOT / "samples" / "speech.wav", help="speech audio file")
    p.add_argument("--output", type=Path, default=REPO_ROOT / "outputs" / "demo.mp4")
    p.add_argument("--workdir", type=Path, default=REPO_ROOT / "var" / "local", help="logs, ports, avatar cache")
    p.add_argument("--checkpoint", default="", help="wav2lip.pth; without it the 'procedural' model animates the mouth")
    p.add_argument("--sr-checkpoint", default="", help="Real-ESRGAN .pth; without it a Lanczos resize is used")
    p.add_argument("--sr-model", default="realesr-general-x4v3")
    p.add_argument("--no-super-resolution", action="store_true", help="skip the superres stage")
    p.add_argument(
        "--musetalk",
        action="store_true",
        help="also start the lipsync-musetalk stage (the 256 px tier: avatars made with model=musetalk); "
        "without --musetalk-* checkpoints it serves the weight-free 'musetalk-standin'",
    )
    p.add_argument(
        "--model",
        choices=tiers(),
        default=DEFAULT_TIER,
        help="demo: the generator tier the sample avatar is made for; musetalk starts the lipsync-musetalk stage "
        "(as --musetalk) and renders the 256 px tier",
    )
    for name, what in (
        ("unet", "musetalkV15/unet.pth"),
        ("unet-config", "musetalkV15/musetalk.json"),
        ("vae", "the sd-vae folder"),
        ("whisper", "the whisper-tiny folder"),
        ("face-parser", "face-parse-bisent/79999_iter.pth"),
        ("dwpose", "dwpose/dw-ll_ucoco_384.pth"),
    ):
        p.add_argument(f"--musetalk-{name}", default="", help=f"with --musetalk: {what}")
    return p.parse_args(argv)


def musetalk_args(args: argparse.Namespace) -> list[str]:
    """The lipsync-musetalk stage's flags from local mode's --musetalk-* ones (the checkpoints given)."""
    names = ("unet", "unet_config", "vae", "whisper", "face_parser", "dwpose")
    return [
        f"--{n.replace('_', '-')}={getattr(args, 'musetalk_' + n)}" for n in names if getattr(args, "musetalk_" + n)
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.musetalk = args.musetalk or args.model == MUSETALK_TIER  # the tier's demo needs its stage
    args.output.parent.mkdir(parents=True, exist_ok=True)
    extra = {
        "lipsync": [f"--checkpoint={args.checkpoint}"] if args.checkpoint else [],
        "superres": [f"--model={args.sr_model}"]
        + ([f"--checkpoint={args.sr_checkpoint}"] if args.sr_checkpoint else []),
    }
    if args.gateway_port:
        extra["gateway"] = [f"--port={args.gateway_port}"]
    live_workers = args.live_workers if args.live_workers is not None else int(args.command == "serve")
    web = args.command == "serve" and args.web_port >= 0
    if web:
        extra["web"] = [f"--http-port={args.web_port}", "--require-api-key=false"]
    replicas = {"render": args.workers, "live": live_workers, "web": int(web), "lipsync-musetalk": int(args.musetalk)}
    if args.musetalk:
        extra["lipsync-musetalk"] = musetalk_args(args)
    live = f" and {live_workers} live workers" if live_workers else ""
    page = " and the web page" if web else ""
    tier = ", lipsync-musetalk" if args.musetalk else ""
    print(
        f"starting audio, lipsync{tier}, superres, gateway, {args.workers} render workers{live}{page} on 127.0.0.1 (logs in {args.workdir})",
        flush=True,
    )
    started = time.perf_counter()
    with LocalCluster(args.workdir, extra_args=extra, replicas=replicas) as cluster:
        print(f"all services SERVING after {time.perf_counter() - started:.1f} s; gateway at {cluster.gateway_address}")
        if live_workers:
            print(f"live workers at {', '.join(cluster.processes[n].address for n in cluster.replica_names('live'))}")
        if web:
            print(f"web page at {cluster.web_url}")
        if args.command == "serve":
            print("serving; Ctrl-C (or SIGTERM) stops every service", flush=True)
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
            return 0
        with LiplineClient(cluster.gateway_address) as client:
            _, job = render_file(
                client,
                args.avatar,
                args.audio,
                args.output,
                super_resolution=not args.no_super_resolution,
                write=lambda line: print(line, flush=True),
                model=args.model,
            )
            if job.state != gateway_pb2.JOB_STATE_SUCCEEDED:
                print(f"job failed: {job.error}", file=sys.stderr)
                return 1
    info = probe_media(args.output)
    models = ", ".join(f"{m.name} ({m.backend}, {m.precision})" for m in job.models)
    print(
        f"wrote {args.output}: {info['width']}x{info['height']} {info['video_codec']} + {info['audio_codec']}, "
        f"{info['frames']} frames at {info['fps']:g} fps = {info['video_duration']:.2f} s "
        f"(audio {info['audio_duration']:.2f} s); models: {models}; "
        f"rendered in {job.elapsed_seconds:.1f} s ({job.realtime_factor:.1f}x real time)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
