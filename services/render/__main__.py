"""`python -m services.render`: a render worker (claims segments from the job store and renders them)."""

from services.common.server import run
from services.render.service import RenderService
from services.render.settings import RenderSettings

if __name__ == "__main__":
    run(RenderService, RenderSettings)
