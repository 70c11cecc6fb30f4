"""The container images: services/Dockerfile, the Makefile's `images` target and the chart agree.

No Docker engine runs here, so the images are not built in CI (`make images` builds them where one
does); what can be checked without building is checked: the tags the Makefile builds are the ones
the chart pulls, the user is the chart's non-root user, the bases are pinned, the ports are exposed,
everything the Dockerfile copies exists and is not excluded from the build context, and each image
installs its own share of requirements.lock: the gateway and render images no torch (nor what only
torch, the ONNX tools, the mel pipeline or the tests need), and what they keep is complete.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from tests.helpers.tools import helm_binary

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "services" / "Dockerfile").read_text()
VALUES = yaml.safe_load((REPO / "helm" / "lipline" / "values.yaml").read_text())
LOCK = REPO / "requirements.lock"
STAGES = tuple(VALUES["stages"])
NO_TORCH = ("gateway", "render")
# What the gateway and render images must never carry (DESIGN.md section 6, the brief of issue "render workers").
FORBIDDEN_WITHOUT_MODELS = {"torch", "sympy", "mpmath", "networkx", "pytest", "onnx", "onnxruntime", "grpcio-tools",
                            "jsonschema", "kubernetes-validate"}


def _image_requirements():  # noqa: ANN202 - the module
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import image_requirements
    finally:
        sys.path.pop(0)
    return image_requirements


def _installed(service: str) -> set[str]:
    """The normalized names of the lock's packages the image of `service` installs."""
    ir = _image_requirements()
    return {ir.normalize(re.split(r"[\[=]", line, maxsplit=1)[0]) for line in ir.requirements(service, LOCK)}


def test_stages_are_the_charts_stages() -> None:
    assert set(STAGES) == {"audio", "lipsync", "superres", "render", "gateway"}


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
    (protoc_base,) = re.findall(r"^ARG PROTOC_IMAGE=(\S+)$", DOCKERFILE, re.M)
    assert protoc_base == cpu_base


def test_every_stage_port_is_exposed() -> None:
    (exposed,) = re.findall(r"^EXPOSE (.+)$", DOCKERFILE, re.M)
    ports = {int(p) for p in exposed.split()}
    for stage in STAGES:
        assert {VALUES["stages"][stage]["port"], VALUES["stages"][stage]["metricsPort"]} <= ports, stage


def test_copied_paths_exist_and_are_in_the_build_context() -> None:
    ignored = {line.strip().rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip()}
    copies = re.findall(r"^COPY (.+) \S+$", DOCKERFILE, re.M)
    assert copies
    for sources in copies:
        if sources.startswith("--from="):
            continue  # from a build stage, not the context
        for src in sources.split():
            path = src.rstrip("/")
            assert (REPO / path).exists(), f"COPY {src}: no such path"
            assert path.split("/")[0] not in ignored, f"COPY {src}: excluded by .dockerignore"


def test_the_protos_are_compiled_in_a_build_stage_of_their_own() -> None:
    """grpcio-tools (and its setuptools) never reach a service image: the stubs are copied from a stage."""
    stages = re.split(r"^FROM ", DOCKERFILE, flags=re.M)[1:]
    assert len(stages) == 2 and stages[0].startswith("${PROTOC_IMAGE} AS protos")
    assert "gen_protos.py" in stages[0] and "gen_protos.py" not in stages[1].replace("COPY --from=protos", "")
    assert re.search(r"^COPY --from=protos /src/lipline/ lipline/$", stages[1], re.M)


def test_each_image_installs_its_share_of_the_lock() -> None:
    """The service stage installs what scripts/image_requirements.py prints for ${SERVICE}, never the raw lock."""
    service_stage = re.split(r"^FROM ", DOCKERFILE, flags=re.M)[-1]
    installs = re.findall(r"pip install [^\n]*-r (\S+)", service_stage)
    assert installs == ["/tmp/requirements.txt"], installs
    assert 'scripts/image_requirements.py "${SERVICE}" requirements.lock > /tmp/requirements.txt' in service_stage
    assert 'scripts/image_requirements.py --check "${SERVICE}"' in service_stage
    # The lock's own pins: every installed line is a line of the lock.
    lock_lines = {line.strip() for line in LOCK.read_text().splitlines()}
    for service in STAGES:
        assert set(_image_requirements().requirements(service, LOCK)) <= lock_lines, service


def test_gateway_and_render_images_carry_no_torch_nor_dev_tools() -> None:
    for service in NO_TORCH:
        installed = _installed(service)
        assert not installed & FORBIDDEN_WITHOUT_MODELS, (service, sorted(installed & FORBIDDEN_WITHOUT_MODELS))
        # What those services do need is still there.
        assert {"grpcio", "protobuf", "numpy", "av", "opencv-python-headless", "psycopg", "psycopg-binary",
                "psycopg-pool", "obstore", "prometheus-client", "kubernetes"} <= installed, service
    for service in ("lipsync", "superres"):
        assert {"torch", "numpy"} <= _installed(service) and "pytest" not in _installed(service)
    assert "librosa" in _installed("audio")


def _requires(name: str) -> set[str]:
    """The packages `name` requires here (markers evaluated, no extras), normalized."""
    ir = _image_requirements()
    dist = importlib.metadata.distribution(name)
    out = set()
    for raw in dist.requires or []:
        req = Requirement(raw)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.add(ir.normalize(req.name))
    return out


@pytest.mark.parametrize("service", NO_TORCH)
def test_what_the_no_torch_images_keep_is_closed_under_its_dependencies(service: str) -> None:
    """pip would fetch an excluded package back (unpinned) if a kept one required it; none does.

    Checked against the installed metadata of this environment, which install.sh fills from the same lock.
    """
    installed = _installed(service)
    missing = {}
    for name in sorted(installed):
        try:
            needs = _requires(name)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{name} is not installed here (bash scripts/install.sh)")
        if needs - installed:
            missing[name] = sorted(needs - installed)
    assert not missing, f"lipline-{service} keeps packages whose requirements it leaves out: {missing}"


def _top_level_modules(dist_names: set[str]) -> set[str]:
    """The importable top-level names the distributions provide (from their RECORD)."""
    ir = _image_requirements()
    tops = set()
    for dist in importlib.metadata.distributions():
        if ir.normalize(dist.metadata["Name"]) not in dist_names:
            continue
        for file in dist.files or []:
            first = file.parts[0]
            if first.endswith((".dist-info", ".data")) or first in {"..", "bin"} or first.startswith("__"):
                continue
            name = first.removesuffix(".py").split(".")[0]
            if name.isidentifier():
                tops.add(name)
    return tops


@pytest.mark.parametrize("service", NO_TORCH)
def test_the_no_torch_services_start_without_what_their_image_leaves_out(service: str) -> None:
    """`python -m services.<service> --help` (what the image build runs) with the excluded packages unimportable."""
    blocked = _top_level_modules(set(_image_requirements().EXCLUDED[service]))
    assert "torch" in blocked
    script = textwrap.dedent(f"""
        import importlib.abc, runpy, sys
        BLOCKED = {sorted(blocked)!r}
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError("not in the lipline-{service} image: " + name)
        sys.meta_path.insert(0, Block())
        sys.argv = ["services.{service}", "--help"]
        runpy.run_module("services.{service}", run_name="__main__")
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "not in the lipline-" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 0, result.stderr[-3000:]


def test_make_images_builds_the_tags_the_chart_pulls() -> None:
    if shutil.which("make") is None:
        pytest.skip("needs make")
    helm = helm_binary()
    dry = subprocess.run(["make", "-n", "images"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    built = set()
    cpu = set()
    for loop in re.findall(r"for s in ([a-z ]+); do (.*?)-t (\S+) \.", dry.replace("\\\n", " ")):
        stages, args, tag = loop
        built |= {tag.replace("$s", s) for s in stages.split()}
        if "BASE_IMAGE=python:" in args:
            cpu |= set(stages.split())
    rendered = subprocess.run([helm, "template", "x", str(REPO / "helm" / "lipline")], capture_output=True,
                              text=True, check=True).stdout
    pulled = set(re.findall(r'image: "(\S+)"', rendered))
    assert pulled == built and len(built) == len(STAGES), (sorted(pulled), sorted(built))
    # The CPU services (gpu: 0 in the chart) build on the CPU base, the GPU stages on CUDA's.
    assert cpu == {s for s in STAGES if VALUES["stages"][s]["gpu"] == 0}


def test_chart_app_version_is_the_package_version() -> None:
    """The chart pulls images tagged appVersion; `make images` tags them with it too."""
    import tomllib

    chart = yaml.safe_load((REPO / "helm" / "lipline" / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
