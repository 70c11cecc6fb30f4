"""A small tmpfs to make a blob store full or read-only for real (chmod does not stop root).

Mounting needs CAP_SYS_ADMIN (root on a normal machine; many CI containers lack it): `tmpfs` skips
the test, saying so, when the mount fails.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SKIP_REASON = "needs CAP_SYS_ADMIN to mount a tmpfs (a full or read-only blob store is made with one)"


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


def try_mount_tmpfs(folder: Path, size: str) -> str:
    """Mount a tmpfs of `size` on `folder` (created); "" when done, else why not (a skip reason)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        done = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{SKIP_REASON}: {exc}"
    return "" if done.returncode == 0 else f"{SKIP_REASON}: {done.stderr.strip()}"


def unmount(folder: Path) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


@contextlib.contextmanager
def tmpfs(folder: Path, size: str = "300k") -> Iterator[Path]:
    """Mount a tmpfs of `size` on `folder` (created) for the block; skip the test if that is not allowed."""
    reason = try_mount_tmpfs(folder, size)
    if reason:
        pytest.skip(reason)
    try:
        yield folder
    finally:
        unmount(folder)


def set_read_only(folder: Path, read_only: bool) -> None:
    """Remount the tmpfs on `folder` read-only or read-write."""
    done = _mount("-o", f"remount,{'ro' if read_only else 'rw'}", str(folder))
    if done.returncode != 0:
        raise RuntimeError(f"remount of {folder} failed: {done.stderr.strip()}")


def fill(folder: Path, leave_bytes: int = 0) -> Path:
    """Write a filler file until the filesystem under `folder` is full (less `leave_bytes`); returns it.
    Big pieces first, then small ones: it must be quick, to land in the middle of a running job."""
    filler = folder / ".filler"
    with open(filler, "wb") as f:
        for piece in (b"\0" * (1 << 20), b"\0" * 4096):
            try:
                while True:
                    st = os.statvfs(folder)
                    if st.f_bavail * st.f_frsize < leave_bytes + len(piece):
                        break
                    f.write(piece)
                    f.flush()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return filler
