"""services.serving.secret_files: a secret file re-read when it changes (rewritten, or swapped the way
kubelet updates a mounted Secret), a file that does not parse refused with the last good value kept."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from services.serving.auth import parse_api_keys
from services.serving.secret_files import file_stamp, watch_secret_file

ALICE = "alice:" + "a" * 24 + "\n"
BOB = "bob:" + "b" * 24 + "\n"


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def watch(path: Path, applied: list[dict[str, str]], results: list[str]) -> asyncio.Task:
    return asyncio.create_task(
        watch_secret_file(str(path), "API keys file", parse_api_keys, applied.append, 0.02, results.append)
    )


def test_a_rewritten_file_is_applied_and_a_bad_one_refused_keeping_the_last_good(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(ALICE)
    applied: list[dict[str, str]] = []
    results: list[str] = []

    async def scenario() -> None:
        task = watch(keys, applied, results)
        await asyncio.sleep(0.1)
        assert applied == []  # unchanged: nothing re-read
        keys.write_text(ALICE + BOB)
        await until(lambda: len(applied) == 1)
        assert sorted(applied[0]) == ["alice", "bob"]
        keys.write_text("bob:short\n")  # a key under 16 characters: refused
        await until(lambda: results == ["reloaded", "refused"])
        keys.write_text(BOB)
        await until(lambda: len(applied) == 2)
        task.cancel()

    with caplog.at_level(logging.INFO, logger="services.serving.secret_files"):
        asyncio.run(scenario())
    assert sorted(applied[1]) == ["bob"] and results == ["reloaded", "refused", "reloaded"]
    refused = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(refused) == 1 and "previous one stays in force" in refused[0].getMessage()
    assert "short" not in caplog.text  # never the file's content


def test_a_secret_swapped_as_kubelet_does_is_noticed(tmp_path: Path) -> None:
    """A mounted Secret: `keys -> ..data/keys`, `..data -> <timestamped folder>`; an update writes a new
    folder and swaps `..data`. Same size and modification time: the inode tells."""
    for name, text in (("v1", ALICE), ("v2", BOB.replace("bob", "ann"))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "keys").write_text(text)
        os.utime(tmp_path / name / "keys", ns=(10**18, 10**18))
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "keys").symlink_to("..data/keys")
    applied: list[dict[str, str]] = []
    before = file_stamp(str(tmp_path / "keys"))

    async def scenario() -> None:
        task = watch(tmp_path / "keys", applied, [])
        await asyncio.sleep(0.05)
        (tmp_path / "..data_tmp").symlink_to("v2")
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")  # kubelet's atomic swap
        await until(lambda: len(applied) == 1)
        task.cancel()

    asyncio.run(scenario())
    assert file_stamp(str(tmp_path / "keys")) != before
    assert list(applied[0]) == ["ann"]


def test_a_missing_file_is_refused_not_applied(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(ALICE)
    results: list[str] = []
    applied: list[dict[str, str]] = []

    async def scenario() -> None:
        task = watch(keys, applied, results)
        await asyncio.sleep(0.05)
        keys.unlink()
        await until(lambda: results == ["refused"])
        task.cancel()

    asyncio.run(scenario())
    assert applied == []
