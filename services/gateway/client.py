"""A small synchronous client of the public API, for product backends, the demo and tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from lipline.v1 import gateway_pb2, gateway_pb2_grpc
from services.common.server import channel_options

UPLOAD_CHUNK = 1 << 20


class LiplineClient:
    def __init__(self, address: str, max_message_bytes: int = 64 * 1024 * 1024, timeout: float = 600.0) -> None:
        self.channel = grpc.insecure_channel(address, options=channel_options(max_message_bytes))
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> LiplineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_avatar(self, data: bytes, name: str = "", photo_fps: float = 0.0) -> gateway_pb2.Avatar:
        def requests() -> Iterator[gateway_pb2.CreateAvatarRequest]:
            yield gateway_pb2.CreateAvatarRequest(name=name, photo_fps=photo_fps, data=data[:UPLOAD_CHUNK])
            for start in range(UPLOAD_CHUNK, len(data), UPLOAD_CHUNK):
                yield gateway_pb2.CreateAvatarRequest(data=data[start : start + UPLOAD_CHUNK])

        return self.stub.CreateAvatar(requests(), timeout=self.timeout)

    def submit(self, avatar_id: str, audio: bytes, super_resolution: bool = False, crf: int = 0) -> gateway_pb2.Job:
        options = gateway_pb2.JobOptions(super_resolution=super_resolution, crf=crf)
        return self.stub.SubmitJob(
            gateway_pb2.SubmitJobRequest(avatar_id=avatar_id, audio=audio, options=options), timeout=self.timeout
        )

    def wait(self, job_id: str, on_event: Callable[[gateway_pb2.Job], None] | None = None) -> gateway_pb2.Job:
        """Follow WatchJob until the job is finished; returns its final state."""
        job = None
        for event in self.stub.WatchJob(gateway_pb2.WatchJobRequest(job_id=job_id), timeout=self.timeout):
            job = event.job
            if on_event is not None:
                on_event(job)
        assert job is not None
        return job

    def avatar_ids(self) -> set[str]:
        return {a.id for a in self.stub.ListAvatars(gateway_pb2.ListAvatarsRequest(), timeout=self.timeout).avatars}

    def delete_avatar(self, avatar_id: str) -> None:
        self.stub.DeleteAvatar(gateway_pb2.DeleteAvatarRequest(avatar_id=avatar_id), timeout=self.timeout)

    def download(self, job_id: str, path: Path) -> int:
        tmp = path.with_name(path.name + ".part")
        size = 0
        with tmp.open("wb") as f:
            for chunk in self.stub.DownloadOutput(gateway_pb2.DownloadOutputRequest(job_id=job_id), timeout=self.timeout):
                f.write(chunk.data)
                size += len(chunk.data)
        tmp.replace(path)
        return size


def render_file(client: LiplineClient, avatar: Path, audio: Path, output: Path, *, super_resolution: bool = True,
                write: Callable[[str], None] = print) -> tuple[gateway_pb2.Avatar, gateway_pb2.Job]:
    """Register `avatar`, render `audio` onto it and download the MP4 to `output` (when the job succeeds).

    The round trip the demo and the deployment's smoke test both make; progress goes to `write`.
    Returns the avatar and the job's final state; the caller decides what a failure means.
    """
    registered = client.create_avatar(avatar.read_bytes(), name=avatar.name)
    write(f"avatar {registered.id}: {registered.width}x{registered.height}, {registered.frame_count} frame(s), "
          f"face found in {registered.faces_found}")
    job = client.submit(registered.id, audio.read_bytes(), super_resolution=super_resolution)
    write(f"job {job.id}: {job.audio_seconds:.2f} s of audio")
    job = client.wait(job.id, progress_printer(write))
    if job.state == gateway_pb2.JOB_STATE_SUCCEEDED:
        client.download(job.id, output)
    return registered, job


def progress_printer(write: Callable[[str], None], step: float = 0.1) -> Callable[[gateway_pb2.Job], None]:
    """A `wait(on_event=...)` callback that writes one line per `step` of progress and per state change."""
    last = {"progress": -1.0, "state": None}

    def show(job: gateway_pb2.Job) -> None:
        if job.progress - last["progress"] >= step or job.state != last["state"]:
            last["progress"], last["state"] = job.progress, job.state
            write(
                f"  {gateway_pb2.JobState.Name(job.state):20s} {job.stage:8s} {job.frames_done}/{job.total_frames} "
                f"frames  {job.elapsed_seconds:6.1f} s elapsed  eta {job.eta_seconds:.1f} s"
            )

    return show
