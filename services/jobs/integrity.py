"""Checksums of stored outputs: what the render worker records and DownloadOutput verifies.

Why: a blob store can hand back less or other bytes than were stored (a truncated copy, a bad disk,
a hand-edited bucket) and a download that streams them ends OK: the client keeps a damaged video
and never learns it. The join records the output's size and sha256 in the job; DownloadOutput
checks the stored size before the first byte and the hash after the last, and ends DATA_LOSS on a
mismatch (the client knows to discard what it got).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from services.serving.errors import DataLoss


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file, read in chunks (outputs can be hundreds of MB)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def damaged(job_id: str, detail: str) -> DataLoss:
    """The DATA_LOSS error of a stored output that does not match its job record."""
    return DataLoss(f"the stored output of job {job_id} is damaged: {detail}; render it again (submit the job anew)")


class OutputCheck:
    """Follows a download chunk by chunk: counts the bytes, hashes them, and says at the end whether
    they were the output the job recorded. `expected_sha256` '' (jobs older than the record): size only."""

    def __init__(self, job_id: str, expected_bytes: int, expected_sha256: str) -> None:
        self.job_id = job_id
        self.expected_bytes = expected_bytes
        self.expected_sha256 = expected_sha256
        self.seen = 0
        self._hash = hashlib.sha256() if expected_sha256 else None

    def check_size(self, stored_bytes: int) -> None:
        """Before streaming: the stored object's size against the record."""
        if stored_bytes != self.expected_bytes:
            raise damaged(self.job_id, f"{stored_bytes} of {self.expected_bytes} bytes")

    def add(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        if self.seen > self.expected_bytes:
            raise damaged(self.job_id, f"more than the {self.expected_bytes} bytes recorded")
        if self._hash is not None:
            self._hash.update(chunk)

    def finish(self) -> None:
        """After the last chunk: DataLoss unless every byte came and the hash matches."""
        if self.seen != self.expected_bytes:
            raise damaged(self.job_id, f"{self.seen} of {self.expected_bytes} bytes")
        if self._hash is not None and self._hash.hexdigest() != self.expected_sha256:
            raise damaged(
                self.job_id, "checksum mismatch (sha256 of the stored bytes differs from the one recorded at the join)"
            )
