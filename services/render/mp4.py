"""The render workers' MP4 side: H.264 segments (x264, yuv420p, colour tags), the AAC track, and
the join that stream-copies the segments and muxes the audio into one MP4 that plays everywhere
(``+faststart``). The I420 layout, colour tags, presets and frame rates it shares with the live
encoder are in `services.media.video_format`."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from types import TracebackType

import av
import numpy as np

from services.media import av_limits  # noqa: F401 - caps FFmpeg allocations on import
from services.media.video_format import COLOR_TAGS, X264_PRESETS, exact_rate, split_i420, to_yuv420

MUX_AUDIO_RATE = 48_000  # the output's AAC track: the original audio resampled, mono


class _AacTrack:
    """A mono AAC stream of a container, encoded in step with the video (an interleaved file)."""

    _FRAME = 1024  # samples per AAC frame

    def __init__(self, container: av.container.OutputContainer, audio: np.ndarray, rate: int) -> None:
        self._audio = np.ascontiguousarray(audio, dtype=np.float32)
        if self._audio.ndim != 1:
            raise ValueError(f"audio must be mono (1-D), got shape {self._audio.shape}")
        self._container = container
        self.rate = int(rate)
        self._pos = 0  # samples already encoded
        self._stream = container.add_stream("aac", rate=self.rate)
        self._stream.layout = "mono"
        # FFmpeg's "fast" coder: 1.7x faster than its default "twoloop" (0.21 vs 0.36 s per minute of
        # audio on one core), plenty for speech; the AAC track is on every job's critical path.
        self._stream.options = {"aac_coder": "fast"}
        # The native aac encoder accepts only planar float ("fltp"); ask it rather than assume.
        formats = self._stream.codec_context.codec.audio_formats
        if not formats:
            raise RuntimeError("FFmpeg's aac encoder lists no sample formats")
        self._format = formats[0].name

    def encode(self, until: int | None) -> None:
        """Encodes 1024-sample frames up to sample ``until`` (None: to the end, the last frame short)."""
        end = len(self._audio)
        while self._pos < end:
            stop = min(self._pos + self._FRAME, end)
            # Mid-stream, only full frames: the encoder accepts a short frame only as the last one.
            if until is not None and (stop - self._pos < self._FRAME or stop > until):
                return
            frame = av.AudioFrame.from_ndarray(self._audio[None, self._pos : stop], format=self._format, layout="mono")
            frame.sample_rate = self.rate
            frame.pts = self._pos
            frame.time_base = Fraction(1, self.rate)
            self._container.mux(self._stream.encode(frame))
            self._pos = stop

    def finish(self) -> None:
        """Encodes the rest of the audio (even past the last video frame) and flushes the encoder."""
        self.encode(None)
        self._container.mux(self._stream.encode(None))


class _AtomicMp4:
    """An MP4 container opened on a temporary name next to ``path``, renamed to it by `commit`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}.tmp")
        # format= is needed because the temporary name does not end in .mp4.
        self.container = av.open(str(self._tmp), mode="w", format="mp4", container_options={"movflags": "+faststart"})

    def commit(self) -> None:
        self.container.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        try:
            self.container.close()
        except Exception:  # noqa: BLE001 - already failing; the original error matters
            pass
        self._tmp.unlink(missing_ok=True)


class Mp4Writer:
    """Writes an MP4 with H.264 video and optional mono AAC audio, atomically.

    Frames go to a temporary file next to ``path`` that is renamed to ``path`` by :meth:`close`, so a
    half-written file never appears under its final name; leaving a ``with`` block by an exception
    deletes the temporary file instead.

    Example:
        >>> with Mp4Writer(path, 640, 480, 25.0, audio, 16000) as writer:  # doctest: +SKIP
        ...     for frame in frames:
        ...         writer.write(frame)
    """

    def __init__(
        self,
        path: Path,
        width: int,
        height: int,
        fps: float,
        audio: np.ndarray | None,
        audio_rate: int,
        crf: int = 20,
        preset: str = "veryfast",
        threads: int = 0,
    ) -> None:
        """Opens the temporary file and sets up the streams.

        Args:
            path: The final output path.
            width: Frame width (even).
            height: Frame height (even).
            fps: Frame rate; converted to an exact fraction (25 -> 25/1, 29.97 -> 30000/1001).
            audio: Mono float32 PCM in [-1, 1] (1-D), or None for a silent video.
            audio_rate: Audio sample rate in Hz.
            crf: x264 constant rate factor (lower is better quality, bigger files).
            preset: x264 speed preset.
            threads: x264 frame threads; 0 = x264's choice (1.5 per core). Writers that run side by
                side (segments of one clip) split the cores between them instead.
        """
        if width % 2 or height % 2:
            raise ValueError(f"H.264 yuv420p needs an even size, got {width}x{height}")
        if preset not in X264_PRESETS:
            raise ValueError(f"unknown x264 preset {preset!r}; one of {', '.join(X264_PRESETS)}")
        self.path = Path(path)
        self._rate = exact_rate(fps)
        self._frames = 0
        self._closed = False
        self._frame: av.VideoFrame | None = None  # the one frame encoded from (`i420_planes`)
        self._planes: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._file = _AtomicMp4(self.path)
        self._container = self._file.container
        try:
            self._video = self._container.add_stream("libx264", rate=self._rate)
            self._video.width = width
            self._video.height = height
            self._video.pix_fmt = "yuv420p"
            # x264 frame threading (all cores) instead of PyAV's default slice threading: 11.9 vs
            # 13.4 ms per 720p frame on 2 cores, and it scales further on more; the added latency
            # (a few frames in flight) does not matter for a file.
            self._video.codec_context.thread_type = "FRAME"
            self._video.codec_context.thread_count = threads
            self._video.codec_context.time_base = 1 / self._rate
            self._video.options = {"crf": str(crf), "preset": preset}
            # Written into the H.264 VUI (libx264 takes them from the context) and the MP4's colr box.
            for name, value in COLOR_TAGS.items():
                setattr(self._video.codec_context, name, value)
            self._audio = None if audio is None else _AacTrack(self._container, audio, audio_rate)
        except BaseException:
            self.abort()
            raise

    def write(self, frame_bgr: np.ndarray) -> None:
        """Encodes one (height, width, 3) uint8 BGR frame."""
        expected = (self._video.height, self._video.width, 3)
        if frame_bgr.shape != expected:
            # PyAV would silently rescale a mismatched frame; a wrong size is a caller bug.
            raise ValueError(f"frame has shape {frame_bgr.shape}, the video needs {expected}")
        self.write_yuv420(to_yuv420(frame_bgr))

    def i420_planes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Writable Y (height, width), U and V (height/2, width/2) views of the frame the next
        `write_planes` encodes: a caller that composes frames fills them in place.

        Why one frame, reused: `av.VideoFrame.from_ndarray` allocates a fresh 1.4 MB frame per 720p
        frame and copies into it, several times the cost of a copy into a frame already mapped
        (docs/performance.md), and a compositor writing here saves its own output buffer too. It is
        safe because libx264 copies a frame's pixels into its own buffers inside
        `x264_encoder_encode`, which libavcodec calls before `encode` returns (tested: a clip encoded
        from one reused frame decodes to each of its distinct frames).
        """
        if self._planes is None:
            w, h = self._video.width, self._video.height
            self._frame = av.VideoFrame(w, h, "yuv420p")
            views = []
            for plane, rows, cols in zip(self._frame.planes, (h, h // 2, h // 2), (w, w // 2, w // 2)):
                buffer = np.frombuffer(plane, np.uint8)  # type: ignore[call-overload]  # PyAV's stubs: a plane is a buffer
                views.append(buffer.reshape(rows, plane.line_size)[:, :cols])
            self._planes = (views[0], views[1], views[2])
        return self._planes

    def write_planes(self) -> None:
        """Encodes the frame of `i420_planes` as it is now."""
        self.i420_planes()
        frame = self._frame
        assert frame is not None
        frame.pts = self._frames  # time_base is 1/fps, so the duration is exactly frames / fps
        frame.time_base = self._video.codec_context.time_base
        self._container.mux(self._video.encode(frame))
        self._frames += 1
        # Encode the audio alongside the video so the file is interleaved (small read-ahead for
        # players streaming it) instead of all video followed by all audio.
        if self._audio is not None:
            self._audio.encode(until=round(self._frames / self._rate * self._audio.rate))

    def write_yuv420(self, frame_i420: np.ndarray) -> None:
        """Encodes one frame already converted by `to_yuv420` ((height * 3 / 2, width) uint8, I420)."""
        h, w = self._video.height, self._video.width
        expected = (h * 3 // 2, w)
        if frame_i420.shape != expected or frame_i420.dtype != np.uint8:
            raise ValueError(
                f"I420 frame has shape {frame_i420.shape} {frame_i420.dtype}, the video needs {expected} uint8"
            )
        for plane, source in zip(self.i420_planes(), split_i420(frame_i420, h, w)):
            plane[:] = source
        self.write_planes()

    def close(self) -> None:
        """Encodes the rest of the audio, flushes both encoders and moves the file to ``path``."""
        if self._closed:
            return
        try:
            if self._audio is not None:
                self._audio.encode(until=None)
            self._container.mux(self._video.encode(None))
            if self._audio is not None:
                self._audio.finish()
            self._file.commit()
        except BaseException:
            self.abort()
            raise
        self._closed = True

    def abort(self) -> None:
        """Closes the container without finishing it and deletes the temporary file."""
        self._closed = True
        self._file.abort()

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def encode_aac(audio: np.ndarray, rate: int, path: Path) -> None:
    """Encode mono float PCM into an AAC-in-MP4 file (`path`, atomically): the job's audio track.

    Made once at SubmitJob, so the join of a job's segments is a pure stream copy of both tracks.
    """
    out = _AtomicMp4(path)
    try:
        track = _AacTrack(out.container, audio, rate)
        track.finish()
        out.commit()
    except BaseException:
        out.abort()
        raise


def join_segments(parts: Sequence[Path], path: Path, fps: float, audio: Path | None) -> int:
    """Join H.264 MP4 segments of one clip into ``path`` with the AAC track of ``audio``, both by stream copy.

    Every part must come from `Mp4Writer` with the same size, rate and encoder settings and start
    at its own frame 0 (what render workers write); each part's timestamps are shifted by the frames
    before it. Audio packets are interleaved by time with the video (players read ahead little).
    The colour tags (`COLOR_TAGS`) come with the copied stream parameters (SPS/VUI and colr box).
    Written atomically.

    Returns:
        The number of video frames written.
    """
    if not parts:
        raise ValueError("no segments to join")
    rate = exact_rate(fps)
    out = _AtomicMp4(path)
    audio_in = av.open(str(audio)) if audio is not None else None
    try:
        with av.open(str(parts[0])) as first:
            video = out.container.add_stream_from_template(first.streams.video[0])
        audio_out = None
        audio_packets: Iterator[av.Packet] = iter(())
        if audio_in is not None:
            source_audio = audio_in.streams.audio[0]
            audio_out = out.container.add_stream_from_template(source_audio)
            audio_packets = (p for p in audio_in.demux(source_audio) if p.dts is not None)
        pending_audio = next(audio_packets, None)
        frames = 0
        for part in parts:
            with av.open(str(part)) as source:
                stream = source.streams.video[0]
                if stream.time_base is None:  # a demuxed stream has one
                    raise ValueError(f"{part}: the video stream has no time base")
                shift = round(frames / rate / stream.time_base)  # this part's start, in its time base
                count = 0
                for packet in source.demux(stream):
                    if packet.dts is None:  # the demuxer's end-of-stream marker
                        continue
                    if packet.pts is None:  # the segments' packets all carry one
                        raise ValueError(f"{part}: a video packet has no pts")
                    packet.pts += shift
                    packet.dts += shift
                    packet.stream = video
                    out.container.mux(packet)
                    count += 1
                    now = (frames + count) / rate
                    # `or 0`: for mypy only, audio_packets holds packets with a dts
                    while pending_audio is not None and (pending_audio.dts or 0) * pending_audio.time_base <= now:
                        pending_audio.stream = audio_out
                        out.container.mux(pending_audio)
                        pending_audio = next(audio_packets, None)
            frames += count
        while pending_audio is not None:
            pending_audio.stream = audio_out
            out.container.mux(pending_audio)
            pending_audio = next(audio_packets, None)
        out.commit()
    except BaseException:
        out.abort()
        raise
    finally:
        if audio_in is not None:
            audio_in.close()
    return frames
