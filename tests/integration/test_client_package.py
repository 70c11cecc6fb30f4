"""The client package as a backend gets it: `clients/python` built into a wheel and installed apart from
this checkout, its contents checked, and its example script rendering the sample against real services."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from services.local.cluster import REPO_ROOT, LocalCluster
from services.media.probe import probe_media
from tests.integration.util import SAMPLES

CLIENT = REPO_ROOT / "clients" / "python"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed into), built with this interpreter's setuptools."""
    tmp = tmp_path_factory.mktemp("client-package")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    wheels, target, source = tmp / "wheels", tmp / "site", tmp / "source"
    # Built from a copy: setuptools writes build/ and *.egg-info into the folder it builds.
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    build = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = wheels.glob("lipline_client-*.whl")
    install = subprocess.run(
        [*pip, "install", "--no-deps", "--no-build-isolation", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return wheel, target


def run_installed(target: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """This interpreter with only the installed package in front of its own site-packages (grpcio, protobuf):
    run from a folder outside the checkout, with no PYTHONPATH of the tests'."""
    env = {**os.environ, "PYTHONPATH": str(target)}
    return subprocess.run(
        [sys.executable, *args], cwd=target.parent, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_wheel_carries_the_stubs_and_their_types(installed: tuple[Path, Path]) -> None:
    wheel, target = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("gateway_pb2.py", "gateway_pb2.pyi", "gateway_pb2_grpc.py", "session_pb2.py", "common_pb2.py"):
        assert f"lipline_client/v1/{module}" in names
    assert "lipline_client/py.typed" in names
    assert not any(name.startswith(("lipline/", "services/")) for name in names)
    result = run_installed(
        target,
        "-c",
        "import lipline_client, lipline_client.v1.gateway_pb2 as g; "
        "print(lipline_client.__file__); print(g.SubmitJobRequest.DESCRIPTOR.full_name)",
    )
    assert result.returncode == 0, result.stderr
    where, name = result.stdout.split()
    assert Path(where).is_relative_to(target) and name == "lipline.v1.SubmitJobRequest"


def test_the_example_renders_the_sample(installed: tuple[Path, Path], cluster: LocalCluster) -> None:
    _, target = installed
    out = target.parent / "example.mp4"
    example = CLIENT / "examples" / "render.py"
    result = run_installed(
        target,
        str(example),
        cluster.gateway_address,
        str(SAMPLES / "avatar.jpg"),
        str(SAMPLES / "speech.wav"),
        str(out),
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"wrote {out}" in result.stdout
    info = probe_media(out)
    assert info["video_codec"] == "h264" and info["audio_codec"] == "aac" and info["frames"] > 0
