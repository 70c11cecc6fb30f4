"""`python -m services.audio`: run the audio stage."""

from services.serving.native_threads import one_thread_per_process

one_thread_per_process()  # before numpy and OpenCV load: this stage scales by processes

from services.audio.service import AudioService  # noqa: E402 - after one_thread_per_process
from services.audio.settings import AudioSettings  # noqa: E402 - after one_thread_per_process
from services.serving.server import run  # noqa: E402 - after one_thread_per_process

if __name__ == "__main__":
    run(AudioService, AudioSettings)
