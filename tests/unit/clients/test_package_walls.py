"""The client package stands alone: it imports nothing of the services or their generated `lipline` modules
(a backend installs only it, beside grpcio and protobuf; the `agents` extra's numpy, soxr and PyAV only in
the two modules that need them)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "clients" / "python" / "src" / "lipline_client"
ALLOWED = {"lipline_client", "grpc", "google"}
#: the `agents` extra (clients/python/pyproject.toml), imported only by these modules
EXTRA = {"audio.py": {"numpy", "soxr"}, "frames.py": {"av", "numpy"}}


def test_the_client_package_imports_only_itself_grpc_protobuf_and_the_standard_library() -> None:
    import sys

    beyond = {}
    for path in PACKAGE.rglob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
        extra = found - ALLOWED - EXTRA.get(path.name, set()) - set(sys.stdlib_module_names)
        if extra:
            beyond[path.name] = extra
    assert beyond == {}
