"""How long a stream may outlive its connection's max age (services.serving.server.connection_age_grace_s):
the gateway's public streams a day, every other service its SIGTERM drain time, as before."""

from __future__ import annotations

from services.gateway.settings import GatewaySettings
from services.serving.server import connection_age_grace_s
from services.serving.settings import ServiceSettings, parse_settings


def test_the_gateway_lets_streams_outlive_the_connection_age() -> None:
    assert connection_age_grace_s(GatewaySettings()) == 86400.0
    assert connection_age_grace_s(parse_settings(GatewaySettings, ["--max-connection-age-grace-s=30"], {})) == 30.0


def test_other_services_keep_the_drain_time_at_least_one_second() -> None:
    assert connection_age_grace_s(ServiceSettings()) == 20.0
    assert connection_age_grace_s(ServiceSettings(grace_s=0.2)) == 1.0
    assert connection_age_grace_s(ServiceSettings(grace_s=5, max_connection_age_grace_s=600)) == 600.0
