"""Where a job's blobs live in the blob store (the gateway writes some, render workers the rest).

`jobs/<id>/` holds what only the job's rendering needs (its mel windows per segment, the AAC track,
the rendered segments) and is deleted when the job ends; `outputs/<id>.mp4` is the result.
"""

from __future__ import annotations


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
