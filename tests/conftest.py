"""Shared fixtures: the reference data copied from shared/reference, and hardware skips."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import ports

# Bytecode caches on, whatever the environment says (PYTHONDONTWRITEBYTECODE is set on some CI images):
# otherwise each of the ~300 service processes a run starts compiles the project's modules again, and
# each xdist worker re-runs pytest's assertion rewriting of every test module. The caches go to the
# ignored __pycache__ folders; this runs in the controller first, so the workers and every process they
# start inherit it (docs/decisions.md: the suite's workers).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

REFERENCE_DIR = Path(__file__).parent / "data" / "reference"
REPO_ROOT = Path(__file__).resolve().parents[1]
CLIENT_SRC = REPO_ROOT / "clients" / "python" / "src"

# The client package (clients/python) is installed editable by scripts/install.sh; a virtual
# environment made before it existed may lack it, and one shared by several checkouts may find
# another checkout's copy (whose stubs would clash with this one's protos): then this checkout's
# copy is used, here and in the processes the tests start (the smoke check, the demo).
_client_spec = importlib.util.find_spec("lipline_client")
if _client_spec is None or not str(_client_spec.origin or "").startswith(str(CLIENT_SRC)):
    sys.path.insert(0, str(CLIENT_SRC))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CLIENT_SRC), os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    return REFERENCE_DIR


@pytest.fixture(scope="session")
def mel_vector() -> dict[str, np.ndarray]:
    with np.load(REFERENCE_DIR / "mel_vector.npz") as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="session")
def inference_facts() -> dict:
    return json.loads((REFERENCE_DIR / "inference_facts.json").read_text())


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 where connections are refused, held for the test (tests.helpers.ports)."""
    with ports.refused_port() as port:
        yield port


def load_reference_json(name: str) -> dict:
    return json.loads((REFERENCE_DIR / name).read_text())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip gpu/tensorrt tests with a reason that names what is missing."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_cuda = False
    try:
        import tensorrt  # noqa: F401

        has_trt = True
    except Exception:  # noqa: BLE001
        has_trt = False
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)"))
        if "tensorrt" in item.keywords and not has_trt:
            item.add_marker(pytest.mark.skip(reason="needs the TensorRT Python package (import tensorrt failed)"))
