"""`python -m services.gateway.smoke`: one real job through a running gateway, checked end to end.

The deployment's `helm test` runs this in a pod: it registers the bundled sample photo, renders the
bundled speech onto it, downloads the MP4, checks that it holds H.264 video and AAC audio as long as
the speech, and deletes the avatar again (unless it existed before). Exit status 0 = the deployment works; 1 = it does not,
with the reason (a gRPC status code and message, or what was wrong with the video) on stderr.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import grpc

from lipline.v1 import gateway_pb2
from services.gateway.client import LiplineClient, render_file
from services.media.probe import probe_media

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.gateway.smoke", description=__doc__.splitlines()[0])
    p.add_argument("--address", required=True, help="the gateway, host:port")
    p.add_argument("--avatar", type=Path, default=SAMPLES / "avatar.jpg")
    p.add_argument("--audio", type=Path, default=SAMPLES / "speech.wav")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole job")
    p.add_argument("--no-super-resolution", action="store_true")
    return p.parse_args(argv)


def check_video(path: Path, audio_seconds: float) -> str | None:
    """What is wrong with the rendered MP4, or None."""
    info = probe_media(path)
    if info["video_codec"] != "h264" or info["audio_codec"] != "aac":
        return f"expected H.264 + AAC, got {info['video_codec']} + {info['audio_codec']}"
    if abs(info["video_duration"] - audio_seconds) > 0.5:
        return f"video lasts {info['video_duration']:.2f} s for {audio_seconds:.2f} s of speech"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, LiplineClient(args.address, timeout=args.timeout) as client:
        output = Path(tmp) / "smoke.mp4"
        avatar = None
        try:
            # Avatar ids are content-addressed: a user's avatar made from the same sample must survive.
            existing = {a.id for a in client.list_avatars()}
            avatar, job = render_file(
                client,
                args.avatar,
                args.audio,
                output,
                super_resolution=not args.no_super_resolution,
                write=lambda line: print(line, flush=True),
            )
        except grpc.RpcError as exc:
            print(f"smoke: the gateway at {args.address} answered {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
        finally:
            if avatar is not None and avatar.id not in existing:
                try:
                    client.delete_avatar(avatar.id)
                except grpc.RpcError as exc:
                    print(f"smoke: could not delete avatar {avatar.id}: {exc.code().name}", file=sys.stderr)
        if job.state != gateway_pb2.JOB_STATE_SUCCEEDED:
            print(f"smoke: job {job.id} ended {gateway_pb2.JobState.Name(job.state)}: {job.error}", file=sys.stderr)
            return 1
        problem = check_video(output, job.audio_seconds)
        if problem:
            print(f"smoke: job {job.id} succeeded but its MP4 is wrong: {problem}", file=sys.stderr)
            return 1
        print(f"smoke: ok, job {job.id} rendered {job.total_frames} frames in {job.elapsed_seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
