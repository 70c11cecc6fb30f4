"""lipline's Python client: `LiplineClient(address, api_key=...)` and its typed methods.

The generated protobuf and gRPC modules of the public API are `lipline_client.v1.gateway_pb2`,
`session_pb2` and `common_pb2` (with their `_grpc` modules), for the messages the methods return.
`LiveSession` is a live session on asyncio for voice agents (lipline_client.live); with the `agents`
extra, lipline_client.frames decodes its frames to RGB and lipline_client.audio resamples speech.
"""

from lipline_client.client import TERMINAL, Connection, LiplineClient, OutputUrl, converse_start, has_field
from lipline_client.live import LiveSession
from lipline_client.retry import NO_RETRY, RETRY_AFTER_HEADER, RetryPolicy

__all__ = [
    "NO_RETRY",
    "RETRY_AFTER_HEADER",
    "TERMINAL",
    "Connection",
    "LiplineClient",
    "LiveSession",
    "OutputUrl",
    "RetryPolicy",
    "converse_start",
    "has_field",
]
