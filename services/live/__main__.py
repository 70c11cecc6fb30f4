"""`python -m services.live`: a live worker (holds live sessions, paces their frames in real time)."""

from services.serving.native_threads import one_thread_per_process

one_thread_per_process()  # before numpy and OpenCV load: each session encodes on one thread of the pool

from services.live.service import LiveService  # noqa: E402 - after one_thread_per_process
from services.live.settings import LiveSettings  # noqa: E402 - after one_thread_per_process
from services.serving.server import run  # noqa: E402 - after one_thread_per_process

if __name__ == "__main__":
    run(LiveService, LiveSettings)
