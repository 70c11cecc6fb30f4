"""Generate the Python gRPC modules `lipline/v1/*_pb2*.py` from `protos/lipline/v1/*.proto`.

The generated code is not committed: the install step runs this, and it only regenerates when a
.proto is newer than its output, so it is cheap to run every time. `--force` regenerates all.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "protos"


def generate(out_dir: Path = ROOT, force: bool = False) -> list[Path]:
    protos = sorted((PROTO_DIR / "lipline" / "v1").glob("*.proto"))
    outputs = [out_dir / p.relative_to(PROTO_DIR).with_name(p.stem + "_pb2.py") for p in protos]
    stale = force or any(not o.exists() or o.stat().st_mtime < p.stat().st_mtime for p, o in zip(protos, outputs))
    if stale:
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
        for pkg in (out_dir / "lipline", out_dir / "lipline" / "v1"):
            (pkg / "__init__.py").touch()
        print(f"generated {len(protos)} proto modules into {out_dir / 'lipline' / 'v1'}")
    return outputs


if __name__ == "__main__":
    generate(force="--force" in sys.argv)
