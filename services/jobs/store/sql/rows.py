"""Rows <-> the store's dataclasses: how a job or avatar row is read, and a damaged one reported.

A row this lipline cannot read (a state it does not know, a field that is not JSON) becomes
CorruptRecord (DATA_LOSS) naming the field, never a crash: the caller quarantines its job. In a
list it becomes an UnreadableRecord in its place, so one damaged row does not hide the others.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import TypeVar

from services.jobs.store.jobs import AvatarRecord, Job, JobState, UnreadableRecord
from services.jobs.store.sql.tx import Row
from services.serving.errors import CorruptRecord


def encode_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def job_from_row(row: Row) -> Job:
    """The row as a Job; CorruptRecord (DATA_LOSS) naming the field when it cannot be read (a state
    this lipline does not know, a field that is not JSON): a damaged row is reported, never a crash."""
    try:
        return _job_from_row(row)
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptRecord(
            f"job {row['id']!r} has a record this lipline cannot read ({_row_problem(row, exc)}); it cannot run"
        ) from exc


def _row_problem(row: Row, exc: Exception) -> str:
    """Which field of a job row is damaged, in words."""
    try:
        JobState(row["state"])
    except (ValueError, TypeError):
        return f"state {row['state']!r} is not one of {', '.join(f'{int(s)} ({s.name})' for s in JobState)}"
    for name in ("models", "stage_seconds", "labels"):
        try:
            json.loads(row[name])
        except (ValueError, TypeError):
            return f"its {name} field is not JSON: {str(row[name])[:80]!r}"
    return f"{type(exc).__name__}: {exc}"


def _job_from_row(row: Row) -> Job:
    return Job(
        id=row["id"],
        avatar_id=row["avatar_id"],
        owner=row["owner"],
        state=JobState(row["state"]),
        stage=row["stage"],
        options=bytes(row["options"]),
        audio_seconds=float(row["audio_seconds"]),
        fps=float(row["fps"]),
        total_frames=int(row["total_frames"]),
        frames_done=int(row["frames_done"]),
        segments_total=int(row["segments_total"]),
        segments_done=int(row["segments_done"]),
        error=row["error"],
        error_code=int(row["error_code"]),
        models=json.loads(row["models"]),
        stage_seconds=json.loads(row["stage_seconds"]),
        create_time=float(row["create_time"]),
        start_time=float(row["start_time"]),
        finish_time=float(row["finish_time"]),
        output_key=row["output_key"],
        output_bytes=int(row["output_bytes"]),
        version=int(row["version"]),
        trace_context=row["trace_context"],
        tenant=row["tenant"],
        output_sha256=row["output_sha256"],
        labels=json.loads(row["labels"]),
        output_expire_time=float(row["output_expire_time"]),
        output_purge_time=float(row["output_purge_time"]),
        model=row["model"],
    )


def avatar_from_row(row: Row) -> AvatarRecord:
    """The row as an AvatarRecord; CorruptRecord (DATA_LOSS) when its labels are not JSON."""
    fields = {f.name: row[f.name] for f in dataclasses.fields(AvatarRecord)}
    try:
        labels = json.loads(fields["labels"])
    except (ValueError, TypeError) as exc:
        raise CorruptRecord(
            f"avatar {row['id']!r} has a record this lipline cannot read "
            f"(its labels field is not JSON: {str(fields['labels'])[:80]!r})"
        ) from exc
    return AvatarRecord(**{**fields, "labels": labels})


R = TypeVar("R")


def listed(row: Row, read: Callable[[Row], R]) -> R | UnreadableRecord:
    """A row of a list: `read(row)`, or an UnreadableRecord in its place when it is damaged (its
    create_time is a typed column, so the page's keyset still holds)."""
    try:
        return read(row)
    except CorruptRecord as exc:
        return UnreadableRecord(id=row["id"], create_time=float(row["create_time"]), problem=str(exc))


def avatar_to_row(avatar: AvatarRecord) -> dict[str, object]:
    """The avatar's columns (labels as JSON)."""
    return {**dataclasses.asdict(avatar), "labels": encode_json(dict(avatar.labels))}


def add_seconds(total: Mapping[str, float], more: Mapping[str, float]) -> dict[str, float]:
    out = dict(total)
    for stage, seconds in more.items():
        out[stage] = out.get(stage, 0.0) + float(seconds)
    return out
