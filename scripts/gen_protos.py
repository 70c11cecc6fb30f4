"""Generate the Python gRPC modules from `protos/lipline/v1/*.proto`: the services' and the client package's.

- The services' `lipline/v1/*_pb2*.py` (every proto) are not committed: the install step runs this,
  and it only regenerates when a .proto is newer than its output, so it is cheap to run every time.
- The client package's copy (`clients/python/src/lipline_client/v1/`: the public protos only,
  CLIENT_PROTOS) is committed, so `pip install ./clients/python` works from a clone with no protoc;
  its imports are rewritten from `lipline.v1` to `lipline_client.v1` so that the package stands on its
  own beside the services' modules, and its runtime check names the oldest protobuf it runs on,
  CLIENT_GENCODE_FLOOR (6.33, not the protoc's own 7.x): voice-agent frameworks still pin protobuf 6
  (pipecat-ai: protobuf<7), and these stubs use only descriptor-pool and builder calls protobuf 6
  has (tests/integration/test_pipecat.py imports them under protobuf 6). tests/unit/test_protos.py
  checks that it is fresh.

`--force` regenerates all.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "protos"
CLIENT_DIR = ROOT / "clients" / "python" / "src" / "lipline_client" / "v1"
#: the public API and what it imports: what a backend's client needs
CLIENT_PROTOS = ("common", "gateway", "session")
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
_IMPORT = re.compile(r"^from lipline\.v1 import ", re.M)
#: the protobuf version the client's stubs check for at import (see the module's doc)
CLIENT_GENCODE_FLOOR = (6, 33, 0)
_GENCODE_CHECK = re.compile(
    r"(ValidateProtobufRuntimeVersion\(\n\s*_runtime_version\.Domain\.PUBLIC,\n)\s*\d+,\n\s*\d+,\n\s*\d+,\n"
)
_CLIENT_INIT = '"""The generated protobuf and gRPC modules of the public API (scripts/gen_protos.py; do not edit)."""\n'


def _protoc(protos: list[Path], out_dir: Path) -> None:
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *map(str, protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def client_modules(protos_dir: Path = PROTO_DIR) -> dict[str, str]:
    """The client package's generated modules, file name -> text (imports rewritten to lipline_client.v1)."""
    protos = [protos_dir / "lipline" / "v1" / f"{name}.proto" for name in CLIENT_PROTOS]
    with tempfile.TemporaryDirectory() as tmp:
        _protoc(protos, Path(tmp))
        generated = Path(tmp) / "lipline" / "v1"
        out = {"__init__.py": _CLIENT_INIT}
        for name in CLIENT_PROTOS:
            for suffix in SUFFIXES:
                text = (generated / f"{name}{suffix}").read_text()
                text = _IMPORT.sub("from lipline_client.v1 import ", text)
                if suffix == "_pb2.py":
                    text, found = _GENCODE_CHECK.subn(_floor, text)
                    if found != 1:
                        raise SystemExit(f"{name}_pb2.py: protoc's runtime version check has changed shape")
                out[f"{name}{suffix}"] = text
    return out


def _floor(match: re.Match[str]) -> str:
    major, minor, patch = CLIENT_GENCODE_FLOOR
    return f"{match.group(1)}    {major},\n    {minor},\n    {patch},\n"


def generate_client(out_dir: Path = CLIENT_DIR) -> None:
    """Write the client package's modules (only files whose text changed, so mtimes stay put)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in client_modules().items():
        path = out_dir / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def generate(out_dir: Path = ROOT, force: bool = False) -> list[Path]:
    protos = sorted((PROTO_DIR / "lipline" / "v1").glob("*.proto"))
    outputs = [out_dir / p.relative_to(PROTO_DIR).with_name(p.stem + "_pb2.py") for p in protos]
    stale = force or any(not o.exists() or o.stat().st_mtime < p.stat().st_mtime for p, o in zip(protos, outputs))
    if stale:
        _protoc(protos, out_dir)
        for pkg in (out_dir / "lipline", out_dir / "lipline" / "v1"):
            (pkg / "__init__.py").touch()
        print(f"generated {len(protos)} proto modules into {out_dir / 'lipline' / 'v1'}")
        if out_dir == ROOT:
            generate_client()
            print(f"generated {len(CLIENT_PROTOS)} proto modules into {CLIENT_DIR}")
    return outputs


if __name__ == "__main__":
    generate(force="--force" in sys.argv)
