"""A self-signed TLS certificate for servers the tests start on 127.0.0.1 (made with openssl)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_certificate(folder: Path, extra_names: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """A self-signed certificate for localhost, 127.0.0.1 and `extra_names` (DNS names) (PEM files cert, key)."""
    cert, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=" + ",".join(["DNS:localhost", "IP:127.0.0.1", *(f"DNS:{n}" for n in extra_names)]),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key
