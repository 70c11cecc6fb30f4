"""`python -m services.web`: the web page's HTTP server (the page, its API over the gateway, the live WebSocket)."""

from services.serving.server import run
from services.web.service import WebService
from services.web.settings import WebSettings

if __name__ == "__main__":
    run(WebService, WebSettings)
