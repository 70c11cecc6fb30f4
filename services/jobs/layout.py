"""The layout of a job: its tasks in the job store and its blobs in the blob store.

Tasks: each has a kind (`TaskKind`) and a position (its index, which names its blobs). A job that
SubmitJob made has an audio task at index 0 (its AAC track, an empty frame range), its segments at
1..n in frame order, and the join at JOIN_INDEX. The audio task runs beside the segments on
another worker (encoding AAC costs about as much as rendering a minute of video on 16 cores), and
it is claimed first of its job because claims go by index. `segments_total` counts the segments
only.

Blobs: `jobs/<id>/` holds what only the job's rendering needs (the upload, its mel windows per
segment, for a `musetalk` job its whisper log-mel windows, the AAC track, the rendered segments) and
is deleted when the job ends;
`outputs/<id>.mp4` is the result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from services.jobs.store.jobs import TaskKind

# The join's position: the lowest, so the store's lock order (a job's task rows in ascending index)
# takes the join's row first in every transaction that changes several tasks of a job.
JOIN_INDEX = -1


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task as create_job inserts it."""

    index: int
    kind: TaskKind
    start_frame: int
    end_frame: int


def job_tasks(segments: Sequence[tuple[int, int]], total_frames: int, audio_task: bool) -> list[TaskSpec]:
    """A job's tasks: its audio task (when it has one), its segments in frame order, its join (which
    spans the whole clip)."""
    audio = [TaskSpec(0, TaskKind.AUDIO, 0, 0)] if audio_task else []
    first = len(audio)
    return [
        *audio,
        *(TaskSpec(first + k, TaskKind.SEGMENT, int(start), int(end)) for k, (start, end) in enumerate(segments)),
        TaskSpec(JOIN_INDEX, TaskKind.JOIN, 0, int(total_frames)),
    ]


def segment_indices(segments_total: int, audio_task: bool = True) -> range:
    """The task indices of a job's segments (the join reads their blobs in this order)."""
    first = 1 if audio_task else 0
    return range(first, first + segments_total)


def upload_key(job_id: str) -> str:
    return f"jobs/{job_id}/upload"


def job_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/"


def mels_key(job_id: str, segment: int) -> str:
    return f"jobs/{job_id}/mels/{segment:05d}.f16"


def whisper_key(job_id: str, window: int) -> str:
    """A `musetalk` job's 30 s whisper log-mel window `window`: a serialized lipline.v1.AudioWindow, as
    the lipsync-musetalk stage takes it (one per window, not per segment: every segment of a window
    needs all of it, since the encoder's attention spans the window)."""
    return f"jobs/{job_id}/whisper/{window:05d}.pb"


def audio_key(job_id: str) -> str:
    return f"jobs/{job_id}/audio.m4a"


def segment_key(job_id: str, segment: int) -> str:
    return f"jobs/{job_id}/segments/{segment:05d}.mp4"


def output_key(job_id: str) -> str:
    return f"outputs/{job_id}.mp4"
