"""A work function for `services.audio.extract.ClipExtractor` that kills its process on request.

Uploads starting with b"CRASH" die the way a decoder crash does (SIGSEGV, or `os._exit(1)` for
b"CRASHEXIT"); the others are held for `HOLD_S` (so they are still in flight when a crash breaks the
pool) and then extracted for real. Module-level, so spawned pool children can import it by name.
"""

from __future__ import annotations

import os
import signal
import time

from services.audio.extract import Extracted, decode_and_extract

CRASH = b"CRASH"
HOLD_S = 0.3


def crash_or_extract(data: bytes, fps: float, max_seconds: float, whisper: bool = False) -> Extracted:
    if data.startswith(CRASH + b"EXIT"):
        os._exit(1)
    if data.startswith(CRASH):
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(10)  # the signal is delivered asynchronously; never return from here
    time.sleep(HOLD_S)
    return decode_and_extract(data, fps, max_seconds, whisper)
