"""`LiplineVideoGenerator`: a lipline live session as LiveKit Agents' `VideoGenerator`, for an `AvatarRunner`.

The runner pushes the agent's speech (`rtc.AudioFrame`s as the TTS makes them, `AudioSegmentEnd` when a
reply is complete) and calls `clear_buffer()` on a barge-in; it iterates the generator for what to
publish. Here:

- `push_audio(frame)`: the PCM goes to the session (resampled where its rate differs, in 20-40 ms
  chunks); `AudioSegmentEnd` is EndOfUtterance.
- `clear_buffer()`: Clear, at once; the speech not sent and the speech frames still on their way are
  dropped (lipline_client.LiveSession), so the runner's `playback_finished(interrupted=True)` is true.
- iterating: every frame the session sends (idle ones too) as an `rtc.VideoFrame` (RGB24), the speech
  in its re-timed audio as an `rtc.AudioFrame` after it (`LiveSession.speech_audio`: an idle frame's
  silence is not yielded, the runner's AVSynchronizer keeps the clock; the audio of speech frames
  skipped is, with the frame that carries it), and `AudioSegmentEnd` right after the frame holding an
  utterance's last audio, once per utterance that played to its end (none for one cut by
  `clear_buffer()`: the runner reports that one itself, interrupted). The runner's playback position
  is then the audio pushed, sample for sample.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lipline_client import LiveSession
from lipline_client.frames import FrameDecoder
from lipline_client.v1 import session_pb2
from livekit import rtc
from livekit.agents.voice.avatar import AudioSegmentEnd, AvatarOptions, VideoGenerator

FINISHED = session_pb2.SessionEvent.PLAYBACK_FINISHED


class LiplineVideoGenerator(VideoGenerator):
    """A VideoGenerator over one lipline live session (see the module's doc). Build it with `create`."""

    def __init__(self, session: LiveSession) -> None:
        self.session = session
        self._decoder = FrameDecoder(session.codec)
        self._decode_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lipline-decode")

    @classmethod
    async def create(
        cls,
        address: str,
        avatar_id: str,
        *,
        api_key: str | None = None,
        sample_rate: int = 24000,
        codec: str = "jpeg",
        fps: float = 0.0,
        max_height: int = 0,
        **session_args: Any,
    ) -> LiplineVideoGenerator:
        """A new lipline session (`sample_rate`: the agent's TTS's, 16, 24 or 48 kHz; other rates are
        resampled to the session's); `session_args` as lipline_client.LiveSession.create takes them."""
        session = await LiveSession.create(
            address,
            avatar_id,
            api_key=api_key,
            sample_rate=sample_rate,
            codec=codec,
            fps=fps,
            max_height=max_height,
            **session_args,
        )
        return cls(session)

    @property
    def options(self) -> AvatarOptions:
        """The AvatarRunner's options for this session: its frame size and rate, its audio."""
        width, height = self.session.size
        return AvatarOptions(
            video_width=width,
            video_height=height,
            video_fps=self.session.fps,
            audio_sample_rate=self.session.sample_rate,
            audio_channels=1,
        )

    async def push_audio(self, frame: rtc.AudioFrame | AudioSegmentEnd) -> None:
        if isinstance(frame, AudioSegmentEnd):
            self.session.end_utterance()
        else:
            self.session.push_audio(bytes(frame.data), frame.sample_rate, frame.num_channels)

    def clear_buffer(self) -> None:
        self.session.clear()

    def __aiter__(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        loop = asyncio.get_running_loop()
        rate = self.session.sample_rate
        async for item in self.session:
            if isinstance(item, session_pb2.VideoFrame):
                rgb = await loop.run_in_executor(self._decode_thread, self._decoder.rgb, item.data)
                if rgb is None:
                    continue  # an H.264 stream waiting for its keyframe
                yield rtc.VideoFrame(rgb.shape[1], rgb.shape[0], rtc.VideoBufferType.RGB24, rgb.tobytes())
                audio = self.session.speech_audio(item)
                if audio:
                    yield rtc.AudioFrame(audio, rate, 1, len(audio) // 2)
            elif isinstance(item, session_pb2.SessionEvent) and item.kind == FINISHED and not item.interrupted:
                yield AudioSegmentEnd()

    async def aclose(self) -> None:
        """Close the lipline session (CloseSession) and the decoder's thread."""
        await self.session.close()
        self._decode_thread.shutdown(wait=False)
