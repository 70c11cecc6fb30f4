"""Where the audio stage decodes uploads and computes their mel windows: one clip at a time per worker.

Why an executor of its own: with `asyncio.to_thread`, a burst of uploads all progress together under
the GIL and all finish at about the same time, while the render workers downstream wait for the first
one. One dedicated thread (processes=0) or a process pool (processes=N) takes clips in arrival order,
so the first clip is ready as soon as it alone is done, and N processes extract N clips in parallel.

Why processes: FFmpeg (PyAV) has crashed with SIGSEGV on hostile files. In a child process a decoder
crash costs that child, not the server. A crash breaks the whole `ProcessPoolExecutor` though (every
pending future fails with `BrokenProcessPool`), and which request was the culprit is not known; so
each request caught in a breakage is run once more alone in a fresh one-process pool: the innocent
ones succeed there, and the one that kills that pool too is answered `InvalidMedia`.

Children are started with spawn, never fork: the parent runs gRPC's threads, and a forked child
inherits their locks in whatever state they were. A child exits when its parent dies: a parent killed
with SIGKILL (an OOM kill, a test's kill) cannot shut its pool down, and its child would otherwise wait
on the pool's queue for ever (in a pod the kernel ends the container anyway; on a host it would not).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.process import BaseProcess
from typing import NamedTuple

import numpy as np

from services.media.audio import decode_audio
from services.media.mel import SAMPLE_RATE, MelExtractor
from services.media.whisper_mel import SAMPLE_RATE as WHISPER_RATE
from services.media.whisper_mel import whisper_log_mel_segments
from services.serving.errors import InvalidMedia
from services.serving.native_threads import one_thread_per_process

_LOGGER = logging.getLogger(__name__)
MAX_PROCESSES = 64
PARENT_CHECK_S = 1.0  # how often a child looks for its parent


class Extracted(NamedTuple):
    """One upload's features: Wav2Lip's mel windows, its length, and with `whisper` the musetalk tier's."""

    windows: np.ndarray  # (N, 80, 16) float32: one mel window per video frame
    samples: int  # 16 kHz samples decoded
    whisper: np.ndarray | None = None  # (W, 80, 3000) float16: whisper's log-mel per 30 s window, or None


#: (file bytes, fps, max_seconds, whisper) -> Extracted. A module-level function, so a process pool
#: can send it to its children by name.
ExtractFn = Callable[[bytes, float, float, bool], Extracted]

_extractor: MelExtractor | None = None  # one per process, built on first use


def _mel() -> MelExtractor:
    global _extractor
    if _extractor is None:
        _extractor = MelExtractor()
    return _extractor


def decode_and_extract(data: bytes, fps: float, max_seconds: float, whisper: bool = False) -> Extracted:
    """Decode an upload and cut its mel windows (and with `whisper` its whisper log-mel, upstream
    MuseTalk's 30 s windows, float16 as they travel); runs in the executor (thread or child process)."""
    samples = decode_audio(data, SAMPLE_RATE, max_seconds)
    assert WHISPER_RATE == SAMPLE_RATE  # one decode serves both tiers
    log_mel = whisper_log_mel_segments(samples).astype(np.float16) if whisper else None
    return Extracted(_mel().run(samples, fps), len(samples), log_mel)


def _warm() -> None:
    """Pull scipy's lazy imports in and build the mel filter banks before traffic."""
    _mel().run(np.zeros(SAMPLE_RATE // 2, np.float32), 25.0)
    whisper_log_mel_segments(np.zeros(SAMPLE_RATE // 2, np.float32))  # its filter bank


def _start_child(parent_pid: int) -> None:
    """Pool initializer: a child gets the parent's one-thread-per-native-pool policy (spawn passes the
    environment on anyway; this keeps it true for a parent started without `python -m services.audio`),
    ends with its parent, and is warm before it takes its first clip, including a child that replaces
    a crashed one."""
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), name="parent-watch", daemon=True).start()
    one_thread_per_process()
    _warm()


def _exit_with_parent(parent_pid: int) -> None:
    """Exit once the parent is gone (the child is re-parented). A poll rather than prctl's
    PR_SET_PDEATHSIG, which fires when the *thread* that spawned the child ends, not its process."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


def _death(children: list[BaseProcess]) -> str:
    """' (killed by SIGSEGV)' or ' (exit code 1)' for a pool's one dead child, '' if it cannot be told."""
    code = children[0].exitcode if len(children) == 1 else None
    if not code:
        return ""
    if code < 0:
        try:
            return f" (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f" (killed by signal {-code})"
    return f" (exit code {code})"


class ClipExtractor:
    """Runs `work` for one clip at a time per worker, first come first served. Used from one event loop
    (the server's): the pool replacement after a crash relies on it.

    Args:
        processes: 0 = one dedicated thread in this process; N >= 1 = N spawned child processes.
        work: the function a worker runs (module-level, so children can import it); tests pass one
            that crashes its process.
    """

    def __init__(self, processes: int, work: ExtractFn = decode_and_extract) -> None:
        if not 0 <= processes <= MAX_PROCESSES:
            raise ValueError(f"processes must be in 0..{MAX_PROCESSES}, got {processes}")
        self.processes = processes
        self._work = work
        self._generation = 0  # bumped each time the shared pool is replaced after a breakage
        self._executor = self._new_executor()
        # Re-runs after a breakage each start a process; at most `processes` at once, so a crash
        # during a burst does not spawn one child per victim all at the same time.
        self._solo_slots = asyncio.Semaphore(max(1, processes))
        self._solo_pools: set[concurrent.futures.ProcessPoolExecutor] = set()

    def _new_executor(self) -> concurrent.futures.Executor:
        if self.processes == 0:
            return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="audio-extract")
        return self._process_pool(self.processes)

    @staticmethod
    def _process_pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_child,
            initargs=(os.getpid(),),
        )

    async def warm(self) -> None:
        """Start the workers and wait until they have run a clip of silence (children are spawned on
        demand: one warm-up per process starts all of them)."""
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._executor, _warm) for _ in range(max(1, self.processes))))

    async def extract(self, data: bytes, fps: float, max_seconds: float, whisper: bool = False) -> Extracted:
        """The features of one upload (see `decode_and_extract`).

        Raises:
            InvalidMedia, TooLarge: from the decoder, with its message (also across processes); and
                InvalidMedia when the decoder process dies on this upload.
        """
        loop = asyncio.get_running_loop()
        generation = self._generation
        try:
            return await loop.run_in_executor(self._executor, self._work, data, fps, max_seconds, whisper)
        except BrokenProcessPool:
            pass  # outside the except block, so the retry's errors do not chain onto this one
        if generation == self._generation:  # the first victim of this breakage replaces the pool
            self._generation += 1
            broken, self._executor = self._executor, self._new_executor()
            broken.shutdown(wait=False, cancel_futures=True)
            _LOGGER.warning(
                "an audio decoder process died; started a new pool and retrying each request it held alone",
                extra={"processes": self.processes, "generation": self._generation},
            )
        return await self._solo(data, fps, max_seconds, whisper)

    async def _solo(self, data: bytes, fps: float, max_seconds: float, whisper: bool) -> Extracted:
        """Run one request in a fresh pool of one process: if that process dies, this upload killed it."""
        async with self._solo_slots:
            loop = asyncio.get_running_loop()
            pool = self._process_pool(1)
            self._solo_pools.add(pool)
            try:
                future = loop.run_in_executor(pool, self._work, data, fps, max_seconds, whisper)
                # submit() has started the child; keep its handle to read the exit code afterwards
                # (the executor does not expose its processes).
                children = list((getattr(pool, "_processes", None) or {}).values())
                try:
                    return await future
                except BrokenProcessPool:
                    pass
                await asyncio.to_thread(pool.shutdown, wait=True)  # reaps the child: its exit code is set
                death = _death(children)
                _LOGGER.warning(
                    "the audio decoder process died on one upload; rejected it", extra={"death": death.strip(" ()")}
                )
                raise InvalidMedia(
                    f"the audio decoder process died on this upload{death}; the file may be corrupt: re-encode it (WAV, MP3, FLAC, OGG or M4A) and retry"
                )
            finally:
                self._solo_pools.discard(pool)
                pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop the workers; clips not yet started are cancelled, a clip being extracted finishes."""
        for pool in list(self._solo_pools):
            pool.shutdown(wait=False, cancel_futures=True)
        self._executor.shutdown(wait=True, cancel_futures=True)
