"""The web page: a small HTTP server that serves one page and bridges it to the gateway.

A person tries lipline in a browser: upload avatars, render a job and watch its progress, hold a
live session from the microphone (docs/architecture.md section 11). Browsers cannot speak gRPC
streams, so `app` turns each page request into gateway calls made with the user's own API key, and
`live_bridge` carries a live session over one WebSocket. It holds no state and runs no model.

May import: the standard library, aiohttp, grpc, protobuf, `services.serving`. Never another
deployable's package, torch, torchvision, `services.media`, `services.jobs` or `services.inference`
(tests/unit/test_walls.py); its image carries none of them.
"""
