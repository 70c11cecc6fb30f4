"""`python -m services.superres`: run the super-resolution stage."""

from services.serving.server import run
from services.superres.service import SuperResService
from services.superres.settings import SuperResSettings

if __name__ == "__main__":
    run(SuperResService, SuperResSettings)
