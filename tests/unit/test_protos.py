"""The generated lipline/v1 modules match protos/, and the protos follow the house rules.

The install step generates the Python modules with
`python -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. protos/lipline/v1/*.proto`;
this test runs the same command into a temporary folder and compares byte for byte, so a proto edit
without regeneration (a stale `*_pb2.py`) fails here instead of at run time.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "protos"
PROTO_DIR = PROTO_ROOT / "lipline" / "v1"
GENERATED_DIR = REPO_ROOT / "lipline" / "v1"
PROTOS = sorted(PROTO_DIR.glob("*.proto"))
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
REGENERATE = (
    "python -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. protos/lipline/v1/*.proto"
)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The modules protoc generates from protos/ now, in a temporary folder."""
    out = tmp_path_factory.mktemp("generated")
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-Iprotos",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(p.relative_to(REPO_ROOT)) for p in PROTOS),
    ]
    result = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"protoc failed:\n{result.stderr}"
    return out / "lipline" / "v1"


def test_there_are_protos() -> None:
    assert {p.stem for p in PROTOS} >= {"common", "audio", "lipsync", "superres", "gateway"}


@pytest.mark.parametrize("proto", PROTOS, ids=lambda p: p.name)
def test_generated_modules_are_up_to_date(fresh: Path, proto: Path) -> None:
    for suffix in SUFFIXES:
        name = proto.stem + suffix
        committed, generated = GENERATED_DIR / name, fresh / name
        assert generated.is_file(), f"protoc did not produce {name}"
        assert committed.is_file(), f"lipline/v1/{name} is missing; regenerate with: {REGENERATE}"
        assert committed.read_bytes() == generated.read_bytes(), (
            f"lipline/v1/{name} is stale (protos/lipline/v1/{proto.name} changed); regenerate with: {REGENERATE}"
        )


def test_no_generated_module_without_a_proto() -> None:
    stems = {p.stem for p in PROTOS}
    leftovers = [
        p.name
        for p in GENERATED_DIR.iterdir()
        if p.name.endswith(SUFFIXES) and re.sub(r"_pb2(_grpc)?\.pyi?$", "", p.name) not in stems
    ]
    assert leftovers == [], f"generated modules whose .proto is gone: {leftovers}"


@pytest.mark.parametrize("proto", PROTOS, ids=lambda p: p.name)
def test_package_is_lipline_v1(proto: Path) -> None:
    packages = re.findall(r"^\s*package\s+([\w.]+)\s*;", proto.read_text(), flags=re.MULTILINE)
    assert packages == ["lipline.v1"], f"{proto.name} must declare `package lipline.v1;`"


def _has_comment_above(lines: list[str], index: int) -> bool:
    """True when the line right above `index` (no blank line between) is a // comment."""
    return index > 0 and lines[index - 1].strip().startswith("//")


@pytest.mark.parametrize("proto", PROTOS, ids=lambda p: p.name)
def test_every_service_and_rpc_is_documented(proto: Path) -> None:
    """Each service and each rpc has a // comment right above it (the API reference is the proto)."""
    lines = proto.read_text().splitlines()
    services = [i for i, line in enumerate(lines) if re.match(r"\s*service\s+\w+\s*\{", line)]
    undocumented = []
    for start in services:
        name = lines[start].split()[1]
        end = next(i for i in range(start, len(lines)) if lines[i].strip() == "}")
        if not _has_comment_above(lines, start):
            undocumented.append(name)
        rpcs = [i for i in range(start + 1, end) if re.match(r"\s*rpc\s+\w+", lines[i])]
        assert rpcs, f"service {name} declares no rpc"
        undocumented += [
            f"{name}.{lines[i].split()[1].split('(')[0]}" for i in rpcs if not _has_comment_above(lines, i)
        ]
    assert undocumented == [], f"{proto.name}: services/rpcs without a comment: {undocumented}"


def test_the_client_packages_stubs_are_fresh() -> None:
    """clients/python carries its generated modules (committed, imports rewritten to lipline_client.v1):
    they must be what scripts/gen_protos.py makes from protos/ now. Regenerate with
    `.venv/bin/python scripts/gen_protos.py --force` and commit the result."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_protos", REPO_ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    gen_protos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_protos)
    committed = gen_protos.CLIENT_DIR
    for name, text in gen_protos.client_modules().items():
        path = committed / name
        assert path.is_file() and path.read_text() == text, f"{path.relative_to(REPO_ROOT)} is stale"
        assert "from lipline.v1" not in text
