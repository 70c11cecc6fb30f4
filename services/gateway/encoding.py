"""Compositing and encoding one job's frames, in parallel over consecutive segments of the clip.

Why segments: one x264 encoder behind PyAV reached 591 frames/s at 720p on the H200 host on its own
and 3.5 ms a frame inside a running gateway, about the whole budget of the 60 s / 6 s target, while
the GPU stages deliver several times that. The clip is cut into up to `segments` consecutive parts
of at least `MIN_SEGMENT_FRAMES`; each part has its own x264 encoder on its own thread (the cores
split between them), and at the end the parts are joined by a stream copy
(`media.concat_segments`) that also adds the AAC track. The gateway asks the stages for the frames
interleaved across the parts (`interleave_key`), so every encoder is fed from the start instead of
waiting for the frames before its part.

Per frame: a pool of compositor threads pastes the face into its template frame and converts it to
I420 (OpenCV, GIL released, frames independent); each part's encoder thread takes its frames in
order from a bounded queue of those futures (back-pressure to the stages). A single part writes the
final MP4 directly, audio included, as before segmenting existed.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from services.gateway.avatars import Avatar
from services.gateway.media import Mp4Writer, concat_segments, paste_face, to_yuv420

_LOGGER = logging.getLogger(__name__)
MIN_SEGMENT_FRAMES = 100  # 4 s at 25 fps: shorter parts cost more in keyframes than they gain
MAX_PENDING_FRAMES = 32  # composited frames queued ahead of the encoders, all parts together (~1.4 MB each at 720p)
COMPOSITE_THREADS = 4
PROGRESS_EVERY = 25  # frames between progress reports

Bounds = list[tuple[int, int]]  # [start, end) frame ranges of the parts, consecutive, covering the clip


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which a container's cpuset narrows), not the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 2


def segment_bounds(total_frames: int, max_segments: int, min_frames: int = MIN_SEGMENT_FRAMES) -> Bounds:
    """Split `total_frames` into at most `max_segments` consecutive parts of at least `min_frames` (one part if short)."""
    if total_frames <= 0:
        return []
    count = max(1, min(max_segments, total_frames // max(1, min_frames)))
    edges = [round(k * total_frames / count) for k in range(count + 1)]
    return [(edges[k], edges[k + 1]) for k in range(count)]


def interleave_key(frame_index: int, bounds: Bounds) -> tuple[int, int]:
    """Sort key that deals frames out across the parts: each part's 1st frame, then each part's 2nd, ..."""
    part = max(0, bisect.bisect_right([start for start, _ in bounds], frame_index) - 1)
    return frame_index - bounds[part][0], part


@dataclasses.dataclass
class EncodeClock:
    """Seconds spent compositing and encoding, summed over threads (for Job.stage_seconds)."""

    started: float  # perf_counter() at the start of the render
    composite: float = 0.0  # paste_face + I420 conversion, summed over the compositor threads
    encode: float = 0.0  # x264 + AAC + mux (+ the join), summed over the encoder threads
    first_frame: float = 0.0  # render start to the first frame's write returning
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add(self, composite: float = 0.0, encode: float = 0.0) -> None:
        with self._lock:
            self.composite += composite
            self.encode += encode
            if encode and not self.first_frame:
                self.first_frame = time.perf_counter() - self.started


@dataclasses.dataclass
class _Part:
    """One segment of the clip: its frame range, encoder thread, writer and queue of composited frames."""

    start: int
    end: int
    path: Path
    executor: ThreadPoolExecutor
    queue: asyncio.Queue[asyncio.Future | None]
    writer: Mp4Writer | None = None
    task: asyncio.Future | None = None
    next_frame: int = 0


class ClipEncoder:
    """Composites and encodes one clip's frames into `output`, over the parts in `bounds` in parallel.

    Use: `await start()`, then `await put(index, face)` for frames in any order across parts but in
    order within each part (frames skipped inside a part pass through with the template frame), then
    `await finish()`; on any error, `await abort()` (deletes every file it made).
    """

    def __init__(
        self,
        avatar: Avatar,
        output: Path,
        audio_pcm: np.ndarray,
        audio_rate: int,
        bounds: Bounds,
        clock: EncodeClock,
        on_progress: Callable[[int, int], None],
        crf: int = 20,
        preset: str = "veryfast",
    ) -> None:
        if not bounds:
            raise ValueError("a clip needs at least one frame")
        self._avatar = avatar
        self._output = Path(output)
        self._audio = (audio_pcm, audio_rate)
        self._bounds = bounds
        self._clock = clock
        self._on_progress = on_progress
        self._encoder_options = {"crf": crf, "preset": preset}
        self.total_frames = bounds[-1][1]
        self._queued = 0
        self._loop = asyncio.get_running_loop()
        self._compositors = ThreadPoolExecutor(COMPOSITE_THREADS, thread_name_prefix="composite")
        single = len(bounds) == 1
        depth = max(4, MAX_PENDING_FRAMES // len(bounds))
        self._parts = [
            _Part(
                start, end,
                self._output if single else self._output.with_name(f".{self._output.name}.part{k}.mp4"),
                ThreadPoolExecutor(1, thread_name_prefix=f"encode{k}"),
                asyncio.Queue(depth),
                next_frame=start,
            )
            for k, (start, end) in enumerate(bounds)
        ]

    async def start(self) -> None:
        """Open the parts' writers (each on its own encoder thread) and start feeding them."""
        height, width = self._avatar.frames.shape[1:3]
        single = len(self._parts) == 1
        # Parallel parts split the cores; a single encoder lets x264 choose (1.5 threads per core).
        threads = 0 if single else max(2, usable_cpus() // len(self._parts))
        audio, rate = self._audio if single else (None, self._audio[1])

        def open_writer(part: _Part) -> Mp4Writer:
            return Mp4Writer(part.path, width, height, self._avatar.fps, audio, rate, threads=threads, **self._encoder_options)

        writers = await asyncio.gather(
            *(self._loop.run_in_executor(part.executor, open_writer, part) for part in self._parts), return_exceptions=True
        )
        for part, writer in zip(self._parts, writers):
            if isinstance(writer, Mp4Writer):
                part.writer = writer
        failed = [w for w in writers if isinstance(w, BaseException)]
        if failed:
            raise failed[0]
        for part in self._parts:
            part.task = asyncio.ensure_future(self._encode_in_order(part))
        _LOGGER.info(
            "encoding", extra={"output": self._output.name, "frames": self.total_frames, "parts": len(self._parts), "x264_threads": threads}
        )

    async def put(self, index: int, face: np.ndarray | None) -> None:
        """Queue frame `index` with its face (None: the template frame as it is)."""
        part = self._parts[interleave_key(index, self._bounds)[1]]
        if index < part.next_frame:
            raise ValueError(f"frame {index} arrived after frame {part.next_frame - 1} of its part")
        while part.next_frame < index:  # frames without a face before this one
            await self._enqueue(part, part.next_frame, None)
        await self._enqueue(part, index, face)

    async def finish(self) -> None:
        """Queue the frames nobody sent (no face), wait for every encoder, then join the parts."""
        for part in self._parts:
            while part.next_frame < part.end:
                await self._enqueue(part, part.next_frame, None)
            await self._put_checked(part, None)
        await asyncio.gather(*(part.task for part in self._parts))  # type: ignore[misc]
        await asyncio.gather(*(self._loop.run_in_executor(part.executor, self._close, part) for part in self._parts))
        if len(self._parts) > 1:
            t0 = time.perf_counter()
            audio, rate = self._audio
            await asyncio.to_thread(concat_segments, [p.path for p in self._parts], self._output, self._avatar.fps, audio, rate)
            self._clock.add(encode=time.perf_counter() - t0)
            self._remove_parts()
        self._shutdown()

    async def abort(self) -> None:
        """Stop feeding, drop queued frames, close and delete every file; never raises."""
        for part in self._parts:
            if part.task is not None:
                part.task.cancel()
            while not part.queue.empty():
                frame = part.queue.get_nowait()
                if frame is not None:
                    frame.cancel()
        await asyncio.gather(*(p.task for p in self._parts if p.task is not None), return_exceptions=True)
        await asyncio.gather(
            *(self._loop.run_in_executor(p.executor, p.writer.abort) for p in self._parts if p.writer is not None),
            return_exceptions=True,
        )
        if len(self._parts) > 1:
            self._remove_parts()
        self._shutdown()

    # ---------------------------------------------------------------------------------------------

    async def _enqueue(self, part: _Part, index: int, face: np.ndarray | None) -> None:
        frame = self._loop.run_in_executor(self._compositors, self._composite, index, face)
        part.next_frame = index + 1
        await self._put_checked(part, frame)
        self._queued += 1
        if self._queued % PROGRESS_EVERY == 0:
            self._on_progress(self._queued, self.total_frames)

    async def _put_checked(self, part: _Part, frame: asyncio.Future | None) -> None:
        """Queue a frame (None: the end) for the part's encoder; raises its error if it stopped."""
        assert part.task is not None, "start() first"
        if part.task.done():  # the encoder stopped early, so it failed
            await part.task
        if not part.queue.full():
            part.queue.put_nowait(frame)
            return
        # Wait for room, or for the encoder to fail (then nothing would ever make room).
        put = asyncio.ensure_future(part.queue.put(frame))
        await asyncio.wait({put, part.task}, return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()
            if frame is not None:
                frame.cancel()
            await part.task

    async def _encode_in_order(self, part: _Part) -> None:
        while (frame := await part.queue.get()) is not None:
            await self._loop.run_in_executor(part.executor, self._encode, part, await frame)

    def _composite(self, index: int, face: np.ndarray | None) -> np.ndarray:
        """Runs on a compositor thread: paste the face (if any) into its template frame, convert to I420."""
        t0 = time.perf_counter()
        frame_index = self._avatar.frame_for(index)
        frame = np.asarray(self._avatar.frames[frame_index])
        if face is not None:
            frame = paste_face(frame, face, self._avatar.boxes[frame_index])  # type: ignore[arg-type]
        i420 = to_yuv420(frame)
        self._clock.add(composite=time.perf_counter() - t0)
        return i420

    def _encode(self, part: _Part, frame_i420: np.ndarray) -> None:
        """Runs on the part's encoder thread, in frame order."""
        t0 = time.perf_counter()
        part.writer.write_yuv420(frame_i420)  # type: ignore[union-attr]
        self._clock.add(encode=time.perf_counter() - t0)

    def _close(self, part: _Part) -> None:
        """Runs on the part's encoder thread: the encoder's flush (and, for a single part, the audio) and rename."""
        t0 = time.perf_counter()
        part.writer.close()  # type: ignore[union-attr]
        self._clock.add(encode=time.perf_counter() - t0)

    def _remove_parts(self) -> None:
        for part in self._parts:
            part.path.unlink(missing_ok=True)

    def _shutdown(self) -> None:
        self._compositors.shutdown(wait=False, cancel_futures=True)
        for part in self._parts:
            part.executor.shutdown(wait=False, cancel_futures=True)
