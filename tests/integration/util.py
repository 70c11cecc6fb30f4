"""Helpers shared by the integration tests (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import time
import uuid
import wave
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.jobs.layout import output_key
from services.jobs.store import open_blob_store
from services.jobs.store.jobs import JobStore, NewJob
from services.local.cluster import REPO_ROOT, LocalCluster
from services.local.metrics import metric_value, scrape

SAMPLES = REPO_ROOT / "samples"
LOG_TAIL = 6000


def logs_of(cluster: LocalCluster) -> str:
    """The tail of every service's log, for failure reports."""
    return "\n".join(
        f"----- {name} ({proc.log_path}) -----\n{proc.log()[-LOG_TAIL:]}" for name, proc in cluster.processes.items()
    )


@contextlib.contextmanager
def start_cluster(workdir: Path, **kwargs: object) -> Iterator[LocalCluster]:
    """A started LocalCluster in `workdir`; on a start-up failure every service's log is printed."""
    cluster = LocalCluster(workdir, **kwargs)
    try:
        cluster.__enter__()
    except BaseException:
        print(logs_of(cluster))
        raise
    try:
        yield cluster
    finally:
        cluster.stop()


def cut_wav(data: bytes, seconds: float) -> bytes:
    """The first `seconds` of a PCM WAV file, as a new WAV file (same rate, width and channels)."""
    with wave.open(io.BytesIO(data)) as src:
        params = src.getparams()
        frames = src.readframes(round(seconds * params.framerate))
    out = io.BytesIO()
    with wave.open(out, "wb") as dst:
        dst.setparams(params)
        dst.writeframes(frames)
    return out.getvalue()


def stage_channel(cluster: LocalCluster, stage: str) -> grpc.Channel:
    """A plain channel straight to one stage of the cluster (no gateway), with 128 MiB message limits."""
    options = [("grpc.max_send_message_length", 128 * 2**20), ("grpc.max_receive_message_length", 128 * 2**20)]
    return grpc.insecure_channel(cluster.processes[stage].address, options=options)


def process_metric(cluster: LocalCluster, process: str, name: str, **labels: str) -> float:
    """One sample of a cluster process's /metrics (0 where it has none yet)."""
    return metric_value(scrape(cluster.processes[process].metrics_port), name, **labels)


def health_status(address: str, service: str = "", timeout: float = 5.0) -> int:
    """grpc.health.v1 Check over a fresh channel."""
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
    return reply.status


def assert_all_serving(cluster: LocalCluster) -> None:
    """Every process of the cluster is alive and reports SERVING."""
    for name in ("gateway", *cluster.stages):
        proc = cluster.processes[name]
        assert proc.process.poll() is None, f"{name} exited with {proc.process.returncode}:\n{proc.log()[-LOG_TAIL:]}"
        assert health_status(proc.address) == health_pb2.HealthCheckResponse.SERVING, name


def eventually(check: Callable[[], Any], timeout: float = 40.0, what: str = "", every: float = 0.25) -> Any:
    """Poll `check` until it returns something truthy and return that; fail the test after `timeout`."""
    import pytest

    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
    return result


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory (VmRSS; VmHWM: its peak so far) in MiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for process {pid}")


def new_job(store: JobStore, owner: str = "setup") -> str:
    """A QUEUED job of one segment (and its audio task) created in the job store directly: no avatar,
    no audio; `finish_job` completes it."""
    job_id = uuid.uuid4().hex[:20]
    store.create_job(NewJob(job_id, "0" * 24, owner, b"", 1.0, 25.0, 25, [(0, 25)], audio_task=True))
    return job_id


def finish_job(store: JobStore, job_id: str, output: bytes, blob_store: str) -> None:
    """Do what render workers do, without rendering: claim and complete every task, store the output
    and record its size and sha256 (what DownloadOutput checks). The cluster must run no render worker."""
    open_blob_store(blob_store).put(output_key(job_id), output)
    while (task := store.claim("test", 60.0, 3)) is not None:
        assert task.job_id == job_id, "finish_job() needs the job to be the only one with claimable tasks"
        if task.is_join:
            sha256 = hashlib.sha256(output).hexdigest()
            assert store.complete_join(task, output_key(job_id), len(output), {}, sha256)
        else:
            assert store.complete_segment(task, task.end_frame - task.start_frame, {}, [])
    assert store.get_job(job_id).output_bytes == len(output)


def write_template(path: Path, frames: list, fps: float, crf: int = 8) -> None:
    """A template video from BGR frames (near-lossless by default: what a user would upload)."""
    from services.render.mp4 import Mp4Writer

    height, width = frames[0].shape[:2]
    with Mp4Writer(path, width, height, fps, None, 16_000, crf=crf) as writer:
        for frame in frames:
            writer.write(frame)


def codec_floor(source: Path, path: Path, crf: int) -> Path:
    """The codec floor of a quality test: `source` decoded and re-encoded alone, with the writer and
    crf the render workers use (what an output could at best be)."""
    import av

    from services.render.mp4 import Mp4Writer

    with av.open(str(source)) as container:
        stream = container.streams.video[0]
        width, height, fps = stream.codec_context.width, stream.codec_context.height, float(stream.average_rate)
        with Mp4Writer(path, width, height, fps, None, 16_000, crf=crf) as writer:
            for frame in container.decode(video=0):
                writer.write_yuv420(frame.to_ndarray(format="yuv420p"))
    return path


def render_template(
    folder: Path, source: Path, audio_seconds: float, crf: int, name: str, model: str = ""
) -> tuple[Any, Path, list, Any]:
    """A template video rendered with the sample speech through a fresh LocalCluster (1 s segments), as
    an avatar of the `model` tier ("": the default; "musetalk" starts the lipsync-musetalk stage too):
    (the finished Job, the output MP4, the avatar's stored face boxes per template frame, the Avatar)."""
    import json

    from lipline.v1 import gateway_pb2
    from services.gateway.client import LiplineClient

    replicas = {"lipsync-musetalk": 1} if model == "musetalk" else {}
    extra_args = {"gateway": ["--segment-seconds=1.0"]}
    with start_cluster(folder / "cluster", extra_args=extra_args, replicas=replicas) as cluster:
        with LiplineClient(cluster.gateway_address, timeout=180) as client:
            avatar = client.create_avatar(source.read_bytes(), name=name, model=model)
            job = client.submit_job(avatar.id, cut_wav((SAMPLES / "speech.wav").read_bytes(), audio_seconds), crf=crf)
            done = client.wait(job.id)
            assert done.state == gateway_pb2.JOB_STATE_SUCCEEDED, done.error
            output = folder / "output.mp4"
            client.download(job.id, output)
            meta = json.loads(next(Path(cluster.blob_store).rglob(f"avatars/{avatar.id}/meta.json")).read_bytes())
    return done, output, meta["boxes"], avatar


def silent_frames_between(track: bytes, speech: bytes, span: int) -> int:
    """How many whole silent frames `track` inserts into `speech`, which it must otherwise hold sample
    for sample from its start: a chunk that reached the worker after its slot (a real-time test
    client descheduled on a loaded machine) pauses the utterance for a frame of silence, losing nothing.
    Raises where a sample differs or the speech is cut short; how many pauses there are depends on the
    machine's load (measured in bench/, printed by the tests)."""
    played, pauses = 0, 0
    for at in range(0, len(track), span):
        if played >= len(speech):
            return pauses
        part, expected = track[at : at + span], speech[played : played + span]
        if part[: len(expected)] == expected:
            played += len(expected)
        elif part == bytes(len(part)) and played % span == 0:
            pauses += 1
        else:
            raise AssertionError(f"speech sample {played // 2} differs in the track's frame {at // span}")
    if played >= len(speech):
        return pauses
    raise AssertionError(f"the track ends after {played // 2} of the speech's {len(speech) // 2} samples")


def assert_audio_locked(frames: Sequence[Any], slot: int) -> None:
    """A live stream's audio is locked to its frames: each frame after the first carries whole slots
    (`slot` bytes each) of audio, its own and those of the slots skipped right before it, so at least
    one and at most as many as since the previous frame (a frame dropped for a slow reader went with
    its audio). The first frame may carry slots skipped before it too: where the stream began."""
    for before, frame in zip(frames, frames[1:]):
        size = len(frame.audio)
        assert size % slot == 0 and slot <= size <= (frame.index - before.index) * slot, (
            before.index,
            frame.index,
            size // slot,
        )
