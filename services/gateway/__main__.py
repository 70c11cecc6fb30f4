"""`python -m services.gateway`: run the public API."""

from services.common.server import run
from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings

if __name__ == "__main__":
    run(GatewayService, GatewaySettings)
