"""The layout of a job: its tasks in the job store and its blobs in the blob store.

Tasks: task 0 of every job makes its AAC track (an empty frame range); tasks 1..n render the
segments, in frame order; the join comes last. The audio task runs beside the segments on
another worker (encoding AAC costs about as much as rendering a minute of video on 16 cores), and
it is claimed first because claims go by index.

Blobs: `jobs/<id>/` holds what only the job's rendering needs (the upload, its mel windows per
segment, the AAC track, the rendered segments) and is deleted when the job ends;
`outputs/<id>.mp4` is the result.
"""

from __future__ import annotations

AUDIO_TASK = 0  # the task index that encodes the job's AAC track


def task_ranges(segments: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The job store's task ranges for a clip cut into `segments`: the audio task, then the segments."""
    return [(0, 0), *segments]


def segment_tasks(segments_total: int) -> range:
    """The task indices of a job's segments (for the join), given the store's segments_total."""
    return range(AUDIO_TASK + 1, segments_total)


def upload_key(job_id: str) -> str:
    return f"jobs/{job_id}/upload"


def job_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/"


def mels_key(job_id: str, segment: int) -> str:
    return f"jobs/{job_id}/mels/{segment:05d}.f16"


def audio_key(job_id: str) -> str:
    return f"jobs/{job_id}/audio.m4a"


def segment_key(job_id: str, segment: int) -> str:
    return f"jobs/{job_id}/segments/{segment:05d}.mp4"


def output_key(job_id: str) -> str:
    return f"outputs/{job_id}.mp4"
