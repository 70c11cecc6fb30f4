"""lipline's live avatars for LiveKit Agents.

`AvatarSession(avatar_id=..., address=...).start(agent_session, room)` puts a lipline avatar in the
agent's own process (as livekit-plugins-bithuman's local mode does): the agent's audio goes to a lipline
live session, and the avatar's frames with the re-timed audio are published to the room by an
AvatarRunner. `LiplineVideoGenerator` is the VideoGenerator under it, for an AvatarRunner of your own.
"""

from livekit.agents import Plugin

from .avatar import AvatarSession
from .log import logger
from .video_generator import LiplineVideoGenerator
from .version import __version__

__all__ = ["AvatarSession", "LiplineVideoGenerator", "__version__"]


class LiplinePlugin(Plugin):
    def __init__(self) -> None:
        super().__init__(__name__, __version__, __package__, logger)


Plugin.register_plugin(LiplinePlugin())
