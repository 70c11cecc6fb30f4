"""lipline's live avatars in Pipecat: `LiplineVideoService`, placed after the TTS service."""

from lipline_pipecat.video import LiplineVideoService

__all__ = ["LiplineVideoService"]
