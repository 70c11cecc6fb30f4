"""The services' command-line client and the round trip the demo and the smoke test make, on the client package.

lipline_client (clients/python, the `lipline-client` distribution backends install) is the client:
`LiplineClient` is its class, re-exported here so the services, tests and benchmarks use what ships.
This module adds what only the repository needs: `render_file` (register, submit, follow, download:
the demo and `helm test`), `progress_printer`, and the command line, whose `live` command streams a
speech file through a live session (services.gateway.live_client):
`python -m services.gateway.client live --avatar ID speech.wav out.mp4`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lipline_client import TERMINAL, LiplineClient, RetryPolicy
from lipline_client.v1 import gateway_pb2

__all__ = ["TERMINAL", "LiplineClient", "RetryPolicy", "main", "progress_printer", "render_file"]


def render_file(
    client: LiplineClient,
    avatar: Path,
    audio: Path,
    output: Path,
    *,
    super_resolution: bool = True,
    write: Callable[[str], None] = print,
    model: str = "",
) -> tuple[gateway_pb2.Avatar, gateway_pb2.Job]:
    """Register `avatar` (for the generator tier `model`; "" the default), render `audio` onto it and
    download the MP4 to `output` (when the job succeeds).

    The round trip the demo and the deployment's smoke test both make; progress goes to `write`.
    Returns the avatar and the job's final state; the caller decides what a failure means.
    """
    registered = client.create_avatar(avatar.read_bytes(), name=avatar.name, model=model)
    write(
        f"avatar {registered.id} ({registered.model}): {registered.width}x{registered.height}, "
        f"{registered.frame_count} frame(s), face found in {registered.faces_found}"
    )
    job = client.submit_job(registered.id, audio.read_bytes(), super_resolution=super_resolution)
    write(f"job {job.id}: {job.audio_seconds:.2f} s of audio")
    job = client.wait(job.id, progress_printer(write))
    if job.state == gateway_pb2.JOB_STATE_SUCCEEDED:
        client.download(job.id, output)
    return registered, job


def progress_printer(write: Callable[[str], None], step: float = 0.1) -> Callable[[gateway_pb2.Job], None]:
    """A `wait(on_event=...)` callback that writes one line per `step` of progress and per state change."""
    last: dict[str, Any] = {"progress": -1.0, "state": None}

    def show(job: gateway_pb2.Job) -> None:
        if job.progress - last["progress"] >= step or job.state != last["state"]:
            last["progress"], last["state"] = job.progress, job.state
            write(
                f"  {gateway_pb2.JobState.Name(job.state):20s} {job.stage:8s} {job.frames_done}/{job.total_frames} "
                f"frames  {job.elapsed_seconds:6.1f} s elapsed  eta {job.eta_seconds:.1f} s"
            )

    return show


def main(argv: list[str] | None = None) -> int:
    """`python -m services.gateway.client live ...` (services.gateway.live_client has the commands)."""
    from services.gateway.live_client import live_command, parse_args

    args = parse_args(argv)
    with LiplineClient(args.address, api_key=args.api_key) as client:
        return live_command(client, args)


if __name__ == "__main__":
    sys.exit(main())
