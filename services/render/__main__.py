"""`python -m services.render`: a render worker (claims segments from the job store and renders them)."""

from services.serving.native_threads import one_thread_per_process

one_thread_per_process()  # before numpy and OpenCV load: this stage scales by processes

from services.render.service import RenderService  # noqa: E402 - after one_thread_per_process
from services.render.settings import RenderSettings  # noqa: E402 - after one_thread_per_process
from services.serving.server import run  # noqa: E402 - after one_thread_per_process

if __name__ == "__main__":
    run(RenderService, RenderSettings)
