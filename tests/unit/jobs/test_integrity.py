"""services/jobs/integrity.py: what DownloadOutput decides about a stored output, chunk by chunk."""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc
import pytest

from services.jobs.integrity import OutputCheck, file_sha256
from services.serving.errors import DataLoss

DATA = bytes(range(256)) * 1000
SHA = hashlib.sha256(DATA).hexdigest()


def stream(check: OutputCheck, data: bytes, chunk: int = 4096) -> None:
    for i in range(0, len(data), chunk):
        check.add(data[i : i + chunk])
    check.finish()


def test_file_sha256_is_the_files_hash(tmp_path: Path) -> None:
    path = tmp_path / "out.mp4"
    path.write_bytes(DATA)
    assert file_sha256(path) == SHA


def test_the_recorded_output_passes() -> None:
    check = OutputCheck("j1", len(DATA), SHA)
    check.check_size(len(DATA))
    stream(check, DATA)


def test_a_wrong_stored_size_is_data_loss_before_streaming() -> None:
    with pytest.raises(DataLoss, match=r"job j1 is damaged: 100 of 256000 bytes") as err:
        OutputCheck("j1", len(DATA), SHA).check_size(100)
    assert err.value.code == grpc.StatusCode.DATA_LOSS


def test_same_size_other_bytes_is_a_checksum_mismatch_at_the_end() -> None:
    damaged = DATA[:1000] + b"\xff" + DATA[1001:]
    check = OutputCheck("j1", len(DATA), SHA)
    with pytest.raises(DataLoss, match="checksum mismatch"):
        stream(check, damaged)


def test_bytes_short_of_or_beyond_the_record_are_data_loss() -> None:
    with pytest.raises(DataLoss, match=r"255000 of 256000 bytes"):
        stream(OutputCheck("j1", len(DATA), SHA), DATA[:-1000])
    with pytest.raises(DataLoss, match="more than the 256000 bytes"):
        stream(OutputCheck("j1", len(DATA), SHA), DATA + b"x")


def test_without_a_recorded_checksum_only_the_size_counts() -> None:
    stream(OutputCheck("old", len(DATA), ""), DATA[::-1])  # other bytes, same size: unchecked
    with pytest.raises(DataLoss):
        stream(OutputCheck("old", len(DATA), ""), DATA[:10])
