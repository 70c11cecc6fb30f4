"""The container images: services/Dockerfile, the Makefile's `images` target and the chart agree.

No Docker engine runs here, so the images are not built in CI (`make images` builds them where one
does); what can be checked without building is checked: the tags the Makefile builds are the ones
the chart pulls, the user is the chart's non-root user, the bases are pinned, the ports are exposed
and everything the Dockerfile copies exists and is not excluded from the build context.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.tools import helm_binary

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "services" / "Dockerfile").read_text()
VALUES = yaml.safe_load((REPO / "helm" / "lipline" / "values.yaml").read_text())
STAGES = ("audio", "lipsync", "superres", "gateway")


def test_image_runs_as_the_charts_non_root_user() -> None:
    (user,) = re.findall(r"^USER (\d+):(\d+)$", DOCKERFILE, re.M)
    sec = VALUES["podSecurityContext"]
    assert (int(user[0]), int(user[1])) == (sec["runAsUser"], sec["runAsGroup"]) and int(user[0]) != 0


def test_base_images_are_pinned_cuda_cudnn_and_debian_python() -> None:
    (gpu_base,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE, re.M)
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-cudnn-runtime-ubuntu\d+\.\d+", gpu_base), gpu_base
    makefile = (REPO / "Makefile").read_text()
    (cpu_base,) = re.findall(r"^CPU_BASE \?= (\S+)$", makefile, re.M)
    assert re.fullmatch(r"python:3\.11-slim-\w+", cpu_base), cpu_base


def test_every_stage_port_is_exposed() -> None:
    (exposed,) = re.findall(r"^EXPOSE (.+)$", DOCKERFILE, re.M)
    ports = {int(p) for p in exposed.split()}
    for stage in STAGES:
        assert {VALUES["stages"][stage]["port"], VALUES["stages"][stage]["metricsPort"]} <= ports, stage


def test_copied_paths_exist_and_are_in_the_build_context() -> None:
    ignored = {line.strip().rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip()}
    for sources in re.findall(r"^COPY (.+) \S+$", DOCKERFILE, re.M):
        for src in sources.split():
            path = src.rstrip("/")
            assert (REPO / path).exists(), f"COPY {src}: no such path"
            assert path.split("/")[0] not in ignored, f"COPY {src}: excluded by .dockerignore"


def test_make_images_builds_the_tags_the_chart_pulls() -> None:
    if shutil.which("make") is None:
        pytest.skip("needs make")
    helm = helm_binary()
    dry = subprocess.run(["make", "-n", "images"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    built = set()
    for loop in re.findall(r"for s in ([a-z ]+); do .*?-t (\S+) \.", dry.replace("\\\n", " ")):
        stages, tag = loop
        built |= {tag.replace("$s", s) for s in stages.split()}
    rendered = subprocess.run([helm, "template", "x", str(REPO / "helm" / "lipline")], capture_output=True,
                              text=True, check=True).stdout
    pulled = set(re.findall(r'image: "(\S+)"', rendered))
    assert pulled == built and len(built) == len(STAGES), (sorted(pulled), sorted(built))


def test_chart_app_version_is_the_package_version() -> None:
    """The chart pulls images tagged appVersion; `make images` tags them with it too."""
    import tomllib

    chart = yaml.safe_load((REPO / "helm" / "lipline" / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
