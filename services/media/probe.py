"""Describe an MP4 by decoding it: what the demo, the smoke test and the tests check outputs with."""

from __future__ import annotations

from pathlib import Path

import av

from services.media import av_limits  # noqa: F401 - caps FFmpeg allocations on import
from services.media.decode import DEFAULT_VIDEO_FPS


def probe_media(path: Path) -> dict:
    """Describes an MP4 by decoding it fully (used by tests and the demo to check outputs).

    Args:
        path: The file to probe.

    Returns:
        A dict with ``video_codec``, ``audio_codec`` (None without audio), ``width``, ``height``,
        ``fps`` (float), ``frames`` (decoded count), ``video_duration`` (frames / fps),
        ``audio_duration`` (decoded samples / rate, capped at the stream's declared duration to drop
        the last AAC frame's padding; 0.0 without audio) and ``audio_rate``
        (None without audio).
    """
    with av.open(str(path), mode="r") as container:
        video = container.streams.video[0]
        audio = container.streams.audio[0] if container.streams.audio else None
        frames = samples = 0
        # One demux pass over both streams. The AAC decoder drops the leading priming samples
        # (encoder delay) but not the padding that fills the last 1024-sample frame, which the
        # muxer's edit list marks as beyond the stream's duration; hence the cap below.
        for frame in container.decode(*(s for s in (video, audio) if s is not None)):
            if isinstance(frame, av.VideoFrame):
                frames += 1
            elif isinstance(frame, av.AudioFrame):  # the only other stream decoded
                samples += frame.samples
        fps = float(video.average_rate) if video.average_rate else DEFAULT_VIDEO_FPS
        audio_rate = audio.codec_context.sample_rate if audio is not None else None
        audio_duration = samples / audio_rate if audio_rate else 0.0
        if audio is not None and audio.duration and audio.time_base is not None:
            audio_duration = min(audio_duration, float(audio.duration * audio.time_base))
        return {
            "video_codec": video.codec_context.name,
            "audio_codec": audio.codec_context.name if audio is not None else None,
            "width": video.codec_context.width,
            "height": video.codec_context.height,
            "fps": fps,
            "frames": frames,
            "video_duration": frames / fps,
            "audio_duration": audio_duration,
            "audio_rate": audio_rate,
        }
