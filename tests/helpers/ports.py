"""Ports for tests that share one machine with other test processes (pytest-xdist runs several).

Services under test bind port 0 and report the port they got (services.local.process). Programs
that need a port number up front (PostgreSQL, Prometheus, moto) get one from `free_port`, which a
parallel worker can take between the probe and the bind: their helpers start again on another port
when the log says so (`port_taken`). A test that needs a port where connections are refused holds it
with `refused_port`, so that no other process can start listening there meanwhile.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

#: how often a helper picks another port after the one it probed was taken
PORT_TRIES = 3


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (probe; nothing holds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_taken(log: str) -> bool:
    """Whether a server's log says its port was in use (PostgreSQL, Prometheus and Werkzeug word it alike)."""
    return "address already in use" in log.lower()


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 bound but never listening for the block: connecting to it is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]
