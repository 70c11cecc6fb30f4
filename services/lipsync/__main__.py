"""`python -m services.lipsync`: run the lipsync stage."""

from services.serving.server import run
from services.lipsync.service import LipSyncService
from services.lipsync.settings import LipSyncSettings

if __name__ == "__main__":
    run(LipSyncService, LipSyncSettings)
