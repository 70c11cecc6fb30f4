"""`python -m services.lipsync.musetalk`: run the lipsync-musetalk stage (the 256 px tier, a second
Deployment of the lipsync image)."""

from services.lipsync.musetalk.service import MuseTalkService
from services.lipsync.musetalk.settings import MuseTalkSettings
from services.serving.server import run

if __name__ == "__main__":
    run(MuseTalkService, MuseTalkSettings)
