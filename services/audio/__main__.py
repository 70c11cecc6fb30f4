"""`python -m services.audio`: run the audio stage."""

from services.audio.service import AudioService, AudioSettings
from services.common.server import run

if __name__ == "__main__":
    run(AudioService, AudioSettings)
