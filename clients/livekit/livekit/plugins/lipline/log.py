import logging

logger = logging.getLogger("livekit.plugins.lipline")
