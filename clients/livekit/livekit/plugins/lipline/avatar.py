"""`AvatarSession`: a lipline avatar in the agent's own process, as livekit-plugins-bithuman's local mode does it.

`start(agent_session, room)` creates the lipline session (`LiplineVideoGenerator`), makes a
`QueueAudioOutput` the tail of the agent's audio output (the TTS's frames go there instead of to the
room), and starts an `AvatarRunner` that reads them into the generator and publishes the avatar's
video and the re-timed audio into the room as the agent's own tracks (its local participant: so
`avatar_identity` is that participant's). The runner reports playback started and finished (with
the position, and `interrupted` after a barge-in) back to the agent session, which is how it knows
what the user heard. The remote-worker pattern (the avatar joining the room as a participant of its
own) is not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from livekit import rtc
from livekit.agents.voice.avatar import AvatarRunner, QueueAudioOutput
from livekit.agents.voice.avatar import AvatarSession as BaseAvatarSession

from .log import logger
from .video_generator import LiplineVideoGenerator

if TYPE_CHECKING:
    from livekit.agents.voice.agent_session import AgentSession


class AvatarSession(BaseAvatarSession):
    """A lipline avatar for an AgentSession (see the module's doc); `session_args` go to the lipline
    session (`api_key`, `codec` "jpeg" or "h264", `fps`, `max_height`, TLS: lipline_client.LiveSession)."""

    def __init__(self, *, avatar_id: str, address: str, sample_rate: int = 24000, **session_args: Any) -> None:
        super().__init__()
        self._avatar_id = avatar_id
        self._address = address
        self._sample_rate = sample_rate
        self._session_args = session_args
        self.generator: LiplineVideoGenerator | None = None
        self.runner: AvatarRunner | None = None
        self.audio_output: QueueAudioOutput | None = None

    @property
    def avatar_identity(self) -> str:
        # In process, the avatar's tracks are the agent's own: its local participant publishes them.
        return self._room.local_participant.identity if self._room is not None else ""

    @property
    def provider(self) -> str:
        return "lipline"

    async def start(self, agent_session: AgentSession, room: rtc.Room) -> None:
        await super().start(agent_session, room)
        self.generator = await LiplineVideoGenerator.create(
            self._address, self._avatar_id, sample_rate=self._sample_rate, **self._session_args
        )
        self.audio_output = QueueAudioOutput(sample_rate=self.generator.session.sample_rate, wait_playback_start=True)
        self.runner = AvatarRunner(
            room, audio_recv=self.audio_output, video_gen=self.generator, options=self.generator.options
        )
        await self.runner.start()
        agent_session.output.replace_audio_tail(self.audio_output)
        logger.info("lipline session %s started for room %s", self.generator.session.id, room.name)

    async def aclose(self) -> None:
        await super().aclose()
        if self.runner is not None:
            await self.runner.aclose()
            self.runner = None
        if self.generator is not None:
            await self.generator.aclose()
            self.generator = None
