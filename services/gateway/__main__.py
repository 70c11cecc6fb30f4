"""`python -m services.gateway`: run the public API."""

from services.serving.native_threads import one_thread_per_process

one_thread_per_process()  # before numpy and OpenCV load: this stage scales by processes

from services.gateway.service import GatewayService  # noqa: E402 - after one_thread_per_process
from services.gateway.settings import GatewaySettings  # noqa: E402 - after one_thread_per_process
from services.serving.server import run  # noqa: E402 - after one_thread_per_process

if __name__ == "__main__":
    run(GatewayService, GatewaySettings)
