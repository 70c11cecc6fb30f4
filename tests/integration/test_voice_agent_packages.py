"""The voice-agent packages as an agent's developer gets them: `clients/pipecat` and `clients/livekit` (with
`clients/python`, which both need) built into wheels and installed apart from this checkout, each into the
environment of its framework (Pipecat: .venv-pipecat, protobuf 6; LiveKit Agents: this one, protobuf 7),
then imported from a folder outside the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from services.local.cluster import REPO_ROOT

PIPECAT_PYTHON = REPO_ROOT / ".venv-pipecat" / "bin" / "python"
PACKAGES = {"lipline_client": "python", "pipecat_lipline": "pipecat", "livekit_plugins_lipline": "livekit"}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each package's wheel, built from a copy (setuptools writes build/ and *.egg-info where it builds)."""
    tmp = tmp_path_factory.mktemp("voice-agent-wheels")
    out = {}
    for wheel_name, folder in PACKAGES.items():
        source = tmp / "source" / folder
        shutil.copytree(
            REPO_ROOT / "clients" / folder, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
        )
        build = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(tmp),
                str(source),
            ],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert build.returncode == 0, build.stdout + build.stderr
        (out[wheel_name],) = tmp.glob(f"{wheel_name}-*.whl")
    return out


def install(python: Path | str, wheels: list[Path], target: Path) -> None:
    result = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            *map(str, wheels),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def run(python: Path | str, target: Path, code: str) -> list[str]:
    """`code` under `python` with only `target` in front of its site-packages, from outside the checkout."""
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [str(python), "-c", code], cwd=target.parent, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout.split()


def test_the_wheels_carry_their_modules(wheels: dict[str, Path]) -> None:
    names = {name: set(zipfile.ZipFile(path).namelist()) for name, path in wheels.items()}
    assert {"lipline_client/live.py", "lipline_client/frames.py", "lipline_client/audio.py"} <= names["lipline_client"]
    assert {"lipline_pipecat/__init__.py", "lipline_pipecat/video.py"} <= names["pipecat_lipline"]
    assert "livekit/plugins/lipline/__init__.py" in names["livekit_plugins_lipline"]
    assert not any(
        n.startswith(("livekit/__init__", "livekit/plugins/__init__")) for n in names["livekit_plugins_lipline"]
    )
    for found in names.values():
        assert not any(n.startswith(("lipline/", "services/", "tests/")) for n in found)


def test_pipecat_lipline_installs_beside_pipecat(wheels: dict[str, Path], tmp_path: Path) -> None:
    assert PIPECAT_PYTHON.exists(), "no .venv-pipecat: run scripts/install.sh"
    target = tmp_path / "site"
    install(PIPECAT_PYTHON, [wheels["lipline_client"], wheels["pipecat_lipline"]], target)
    where, client, protobuf = run(
        PIPECAT_PYTHON,
        target,
        "import lipline_pipecat, lipline_client.v1.session_pb2, google.protobuf as p; "
        "print(lipline_pipecat.__file__, lipline_client.__file__, p.__version__)",
    )
    assert Path(where).is_relative_to(target) and Path(client).is_relative_to(target)
    assert protobuf.startswith("6.")  # pipecat-ai's protobuf: the client's stubs load on it


def test_livekit_plugins_lipline_installs_beside_livekit_agents(wheels: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "site"
    install(sys.executable, [wheels["lipline_client"], wheels["livekit_plugins_lipline"]], target)
    where, rtc, client = run(
        sys.executable,
        target,
        "import livekit.plugins.lipline as p, livekit.rtc as r, lipline_client; "
        "print(p.__file__, r.__file__, lipline_client.__file__)",
    )
    assert Path(where).is_relative_to(target) and Path(client).is_relative_to(target)
    assert not Path(rtc).is_relative_to(target)  # the namespace package joins livekit's own
