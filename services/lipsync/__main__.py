"""`python -m services.lipsync`: run the lipsync stage."""

from services.lipsync.service import LipSyncService
from services.lipsync.settings import LipSyncSettings
from services.serving.server import run

if __name__ == "__main__":
    run(LipSyncService, LipSyncSettings)
