"""A live session from the client's side: speech sent in real time, frames received, written to an MP4.

`python -m services.gateway.client live --avatar ID speech.wav out.mp4` does what a voice agent
does: it opens a session (CreateSession), sends the WAV's speech as PCM at the session's rate in
20 ms chunks paced by the wall clock (never faster than real time), then EndOfUtterance, and reads
the frames and the re-timed audio until PLAYBACK_FINISHED. What it received is written to an MP4
for checking by eye and by ear: H.264 access units stream-copied (PyAV remuxes the Annex B stream),
or JPEG frames decoded and encoded with x264; the audio as AAC. It prints the latency, measured
on the client's clock, from the moment the audio for a speech frame had been sent to the moment
that frame arrived (p50/p95), the server's own figures (SessionStats) and the frames skipped
(late at the worker) and dropped (this client read too slowly).

The pieces (`pcm_chunks`, `LiveRecorder`, `write_mp4`) serve the tests and bench/bench_live.py too.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import av
import numpy as np

from lipline_client.v1 import session_pb2
from services.media.audio import decode_audio

CHUNK_MS = 20
FINISH_GRACE_S = 10.0  # after the last chunk, how long to wait for PLAYBACK_FINISHED


class SessionClient(Protocol):
    """What a live session needs of services.gateway.client.LiplineClient (which imports this module
    for its command line, so this one names no client class)."""

    def create_session(
        self,
        avatar_id: str,
        *,
        sample_rate: int = ...,
        codec: int = ...,
        max_height: int = ...,
        fps: float = ...,
        super_resolution: bool = ...,
    ) -> session_pb2.Session: ...

    def converse(self, requests: Iterable[session_pb2.ConverseRequest], timeout: float | None = ...) -> Any: ...
    def close_session(self, session_id: str) -> session_pb2.Session: ...


def pcm_of_audio(data: bytes, sample_rate: int) -> bytes:
    """An audio file (WAV or anything FFmpeg decodes) as PCM s16le mono at `sample_rate`."""
    signal = decode_audio(data, sample_rate=sample_rate)
    return (np.clip(signal, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def pcm_chunks(pcm: bytes, sample_rate: int, chunk_ms: int = CHUNK_MS) -> list[bytes]:
    """`pcm` cut into chunks of `chunk_ms` (the last one shorter, never below one sample)."""
    step = sample_rate * chunk_ms // 1000 * 2
    return [pcm[i : i + step] for i in range(0, len(pcm), step)]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


@dataclasses.dataclass
class LiveRecorder:
    """What one Converse stream brought, with the client's clock: when each chunk went out and each
    frame came in. One utterance: speech frame j shows the input audio [j / fps, (j + 1) / fps)."""

    fps: float
    sample_rate: int
    chunk_s: float = CHUNK_MS / 1000
    sent: list[float] = dataclasses.field(default_factory=list)  # monotonic time each chunk was handed to gRPC
    frames: list[session_pb2.VideoFrame] = dataclasses.field(default_factory=list)
    arrived: list[float] = dataclasses.field(default_factory=list)
    events: list[session_pb2.SessionEvent] = dataclasses.field(default_factory=list)
    stats: list[session_pb2.SessionStats] = dataclasses.field(default_factory=list)
    ready: session_pb2.Ready | None = None
    finished: threading.Event = dataclasses.field(default_factory=threading.Event)

    finished_at: int | None = None  # PLAYBACK_FINISHED's frame: the one after the utterance's last

    def take(self, response: session_pb2.ConverseResponse) -> None:
        """Keep one response; `finished` is set once PLAYBACK_FINISHED has come and so has the
        utterance's last frame (the event may travel ahead of it: it is no frame, so not queued behind one)."""
        kind = response.WhichOneof("response")
        if kind == "frame":
            self.frames.append(response.frame)
            self.arrived.append(time.monotonic())
        elif kind == "event":
            self.events.append(response.event)
            if response.event.kind == session_pb2.SessionEvent.PLAYBACK_FINISHED:
                self.finished_at = response.event.frame
        elif kind == "stats":
            self.stats.append(response.stats)
        elif kind == "ready":
            self.ready = response.ready
        if self.finished_at is not None and self.frames and self.frames[-1].index >= self.finished_at - 1:
            self.finished.set()

    def latencies(self) -> list[float]:
        """Per speech frame: its arrival less the time the chunk holding the end of its audio was sent."""
        out = []
        speech = [(f, t) for f, t in zip(self.frames, self.arrived) if f.speech]
        for j, (_, arrived) in enumerate(speech):
            chunk = max(0, int(np.ceil((j + 1) / self.fps / self.chunk_s - 1e-9)) - 1)
            if chunk < len(self.sent):
                out.append(arrived - self.sent[chunk])
        return out

    def missing(self) -> int:
        """Frame indices never received between the first and the last (skipped or dropped)."""
        if not self.frames:
            return 0
        return self.frames[-1].index - self.frames[0].index + 1 - len(self.frames)

    def summary(self) -> str:
        lat = self.latencies()
        last = self.stats[-1] if self.stats else session_pb2.SessionStats()
        return (
            f"{len(self.frames)} frames ({sum(f.speech for f in self.frames)} speech), {self.missing()} missing; "
            f"latency p50 {percentile(lat, 50) * 1000:.0f} ms p95 {percentile(lat, 95) * 1000:.0f} ms (client clock); "
            f"server p50 {last.latency_p50_seconds * 1000:.0f} ms p95 {last.latency_p95_seconds * 1000:.0f} ms, "
            f"skipped {last.frames_skipped}, dropped {last.frames_dropped}"
        )


def realtime_requests(
    session_id: str,
    token: str,
    chunks: list[bytes],
    recorder: LiveRecorder,
    *,
    chunk_s: float,
    finish_wait_s: float = FINISH_GRACE_S,
) -> Iterator[session_pb2.ConverseRequest]:
    """ConverseStart, the chunks paced by the wall clock, EndOfUtterance; then the stream is held
    open until playback has finished (or `finish_wait_s`), so the frames can come back."""
    yield session_pb2.ConverseRequest(
        start=session_pb2.ConverseStart(session_id=session_id, resume_token=token, last_frame=-1)
    )
    t0 = time.monotonic()
    for i, chunk in enumerate(chunks):
        delay = t0 + i * chunk_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        recorder.sent.append(time.monotonic())
        yield session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=chunk))
    yield session_pb2.ConverseRequest(end_of_utterance=session_pb2.EndOfUtterance())
    recorder.finished.wait(finish_wait_s)


def slot_end_sample(frame: int, rate: int, fps: Fraction) -> int:
    """The sample after frame `frame`'s audio: frame k carries [ceil(k * rate / fps), ceil((k + 1) * rate / fps))."""
    return -(-(frame + 1) * rate * fps.denominator // fps.numerator)


def frame_audio(recorder: LiveRecorder) -> bytes:
    """The received audio in frame order, locked to the frames' times: each frame's audio ends where
    its slot ends; where audio is missing before it (a frame this client never got, with its audio)
    silence fills in. A worker that skips a late frame sends that slot's audio with the next frame,
    so then nothing is missing."""
    if not recorder.frames:
        return b""
    fps = Fraction(recorder.fps).limit_denominator(1001)
    rate, first = recorder.sample_rate, recorder.frames[0].index
    origin = slot_end_sample(first - 1, rate, fps)
    out, length = [], 0
    for frame in recorder.frames:
        start = 2 * (slot_end_sample(frame.index, rate, fps) - origin) - len(frame.audio)
        if length < start:
            out.append(b"\0" * (start - length))
            length = start
        out.append(frame.audio)
        length += len(frame.audio)
    return b"".join(out)


def write_mp4(path: Path, recorder: LiveRecorder, codec: int, width: int, height: int) -> None:
    """The received frames and audio as an MP4 (timestamps from the frames' indices, so gaps stay gaps)."""
    frames = recorder.frames
    if not frames:
        raise ValueError("no frames were received: nothing to write")
    rate = Fraction(recorder.fps).limit_denominator(1001)
    tick = Fraction(1) / rate
    first = frames[0].index
    with av.open(str(path), "w", format="mp4") as out:
        if codec == session_pb2.VIDEO_CODEC_JPEG:
            video = out.add_stream("libx264", rate=rate)
            video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        else:
            source = av.open(io.BytesIO(b"".join(f.data for f in frames)), "r", format="h264")
            video = out.add_stream_from_template(source.streams.video[0])
        video.time_base = tick
        audio = out.add_stream("aac", rate=recorder.sample_rate)
        audio.layout = "mono"
        if codec == session_pb2.VIDEO_CODEC_JPEG:
            for f in frames:
                image = av.open(io.BytesIO(f.data), "r", format="mjpeg")
                picture = next(image.decode(video=0)).reformat(width, height, "yuv420p")
                picture.pts, picture.time_base = f.index - first, tick
                out.mux(video.encode(picture))
                image.close()
            out.mux(video.encode(None))
        else:
            packets = [p for p in source.demux(source.streams.video[0]) if p.size]
            if len(packets) != len(frames):
                raise ValueError(
                    f"{len(frames)} H.264 frames were received but their stream parses into {len(packets)} access units"
                )
            for f, packet in zip(frames, packets):
                packet.stream, packet.time_base = video, tick
                packet.pts = packet.dts = f.index - first
                packet.duration = 1
                out.mux(packet)
            source.close()
        samples = np.frombuffer(frame_audio(recorder), "<i2")
        if samples.size:
            sound = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
            sound.sample_rate, sound.pts = recorder.sample_rate, 0
            out.mux(audio.encode(sound))
        out.mux(audio.encode(None))


def run_session(
    client: SessionClient,
    avatar_id: str,
    speech: bytes,
    *,
    sample_rate: int = 16000,
    codec: int = session_pb2.VIDEO_CODEC_H264,
    max_height: int = 0,
    fps: float = 0.0,
    super_resolution: bool = False,
    chunk_ms: int = CHUNK_MS,
    write: Callable[[str], None] = print,
) -> tuple[session_pb2.Session, LiveRecorder]:
    """CreateSession, one utterance of `speech` (an audio file) in real time, CloseSession."""
    session = client.create_session(
        avatar_id,
        sample_rate=sample_rate,
        codec=codec,
        max_height=max_height,
        fps=fps,
        super_resolution=super_resolution,
    )
    write(
        f"session {session.id}: {session.width}x{session.height} {session_pb2.VideoCodec.Name(session.video.codec)} at {session.video.fps:g} fps"
    )
    recorder = LiveRecorder(session.video.fps, session.audio.sample_rate, chunk_ms / 1000)
    chunks = pcm_chunks(pcm_of_audio(speech, session.audio.sample_rate), session.audio.sample_rate, chunk_ms)
    responses = client.converse(
        realtime_requests(session.id, session.resume_token, chunks, recorder, chunk_s=chunk_ms / 1000)
    )
    try:
        for response in responses:
            recorder.take(response)
            if recorder.finished.is_set():
                break
    finally:
        responses.cancel()
        client.close_session(session.id)
    return session, recorder


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.gateway.client", description="lipline's command-line client")
    commands = p.add_subparsers(dest="command", required=True)
    live = commands.add_parser(
        "live", help="stream a speech file through a live session in real time and write what came back to an MP4"
    )
    live.add_argument(
        "speech", type=Path, help="speech audio (WAV or anything FFmpeg decodes); resampled to the session's rate"
    )
    live.add_argument("output", type=Path, help="the MP4 to write")
    live.add_argument("--avatar", required=True, help="avatar id (CreateAvatar's)")
    address = os.environ.get("LIPLINE_ADDRESS", "127.0.0.1:50051")
    live.add_argument(
        "--address", default=address, help="the gateway (default: $LIPLINE_ADDRESS, else 127.0.0.1:50051)"
    )
    live.add_argument("--api-key", default=None, help="API key (default $LIPLINE_API_KEY)")
    live.add_argument("--codec", choices=["h264", "jpeg"], default="h264")
    live.add_argument("--sample-rate", type=int, default=16000, choices=[16000, 24000, 48000])
    live.add_argument(
        "--max-height", type=int, default=0, help="scale the frames down to at most this height (0: the avatar's)"
    )
    live.add_argument("--fps", type=float, default=0.0, help="frame rate (0: the avatar's)")
    live.add_argument("--chunk-ms", type=int, default=CHUNK_MS, help="audio chunk length (10-100 ms)")
    live.add_argument("--super-resolution", action="store_true")
    return p.parse_args(argv)


def live_command(client: SessionClient, args: argparse.Namespace, write: Callable[[str], None] = print) -> int:
    """`live`: one utterance through a new session, written to args.output, its figures printed."""
    codec = session_pb2.VIDEO_CODEC_JPEG if args.codec == "jpeg" else session_pb2.VIDEO_CODEC_H264
    session, recorder = run_session(
        client,
        args.avatar,
        args.speech.read_bytes(),
        sample_rate=args.sample_rate,
        codec=codec,
        max_height=args.max_height,
        fps=args.fps,
        super_resolution=args.super_resolution,
        chunk_ms=args.chunk_ms,
        write=write,
    )
    write_mp4(args.output, recorder, session.video.codec, session.width, session.height)
    write(f"wrote {args.output}: {recorder.summary()}")
    return 0
