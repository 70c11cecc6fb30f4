"""The client package stands alone: it imports nothing of the services or their generated `lipline` modules
(a backend installs only it, beside grpcio and protobuf)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "clients" / "python" / "src" / "lipline_client"
ALLOWED = {"lipline_client", "grpc", "google"}


def test_the_client_package_imports_only_itself_grpc_protobuf_and_the_standard_library() -> None:
    import sys

    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    assert found - ALLOWED - set(sys.stdlib_module_names) == set()
