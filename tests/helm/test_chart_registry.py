"""A stage added to the chart's list needs no template edit: a dummy stage renders its Deployment,
Service, HPA and NetworkPolicy, valid against the Kubernetes schemas, and the values schema accepts it.

The dummy's traits come from a registry entry (services.serving.stages.Stage), its pod keys from the
superres stage's block, so this is what adding a stage to the registry and to values.yaml gives.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.serving.stages import STAGES, Stage
from tests.helm.test_chart import (
    CHART,
    KUBE_VERSIONS,
    _grpc_callers,
    by_kind,
    container,
    env_of,
    helm,
    render,
    validate_builtin,
)

DUMMY = Stage(
    "facerestore",
    port=50065,
    metrics_port=9096,
    settings="services.serving.settings:ModelStageSettings",
    gpu=True,
    calls=("lipsync",),
)
NAME = f"lip-lipline-{DUMMY.name}"


def values_block(stage: Stage, like: str) -> dict[str, Any]:
    """`stages.<stage>` of values.yaml: the registry's traits over the pod keys of the stage `like`."""
    block = copy.deepcopy(yaml.safe_load((CHART / "values.yaml").read_text())["stages"][like])
    block.update(
        port=stage.port,
        metricsPort=stage.metrics_port,
        gpu=int(stage.gpu),
        headless=not stage.public,
        public=stage.public,
        stores=stage.stores,
        dials=list(stage.calls),
    )
    return block


@pytest.fixture(scope="module")
def extra_values(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("values") / "facerestore-values.yaml"
    path.write_text(yaml.safe_dump({"stages": {DUMMY.name: values_block(DUMMY, like="superres")}}))
    return path


@pytest.fixture(scope="module")
def docs(extra_values: Path) -> list[dict[str, Any]]:
    return render(values=(extra_values,))


def test_a_new_stage_renders_its_deployment_service_hpa_and_network_policy(docs: list[dict[str, Any]]) -> None:
    for kind in ("Deployment", "Service", "HorizontalPodAutoscaler", "NetworkPolicy"):
        assert NAME in by_kind(docs, kind), kind
    deployment = by_kind(docs, "Deployment")[NAME]
    c = container(deployment)
    assert c["image"].endswith(f"/{DUMMY.image}:{yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}")
    assert c["args"] == ["python", "-m", DUMMY.module]
    env = env_of(deployment)
    assert (env["LIPLINE_PORT"], env["LIPLINE_METRICS_PORT"]) == (str(DUMMY.port), str(DUMMY.metrics_port))
    assert env["LIPLINE_LIPSYNC_ADDRESS"].endswith(f"lip-lipline-lipsync.media.svc:{STAGES['lipsync'].port}")
    assert "nvidia.com/gpu" in c["resources"]["limits"]  # a GPU stage by its trait, not its name
    ports = {p["name"]: p["port"] for p in by_kind(docs, "Service")[NAME]["spec"]["ports"]}
    assert ports == {"grpc": DUMMY.port, "metrics": DUMMY.metrics_port}
    # It dials lipsync: lipsync's NetworkPolicy now admits it, beside its own callers.
    assert DUMMY.name in _grpc_callers(by_kind(docs, "NetworkPolicy")["lip-lipline-lipsync"])
    assert _grpc_callers(by_kind(docs, "NetworkPolicy")[NAME]) == set()  # nobody dials it


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_the_new_stages_manifests_validate(docs: list[dict[str, Any]], kube_version: str) -> None:
    ours = [d for d in docs if d["metadata"]["name"] == NAME]
    assert validate_builtin(ours, kube_version) >= 4


def test_the_values_schema_accepts_the_new_stage_strictly(extra_values: Path, tmp_path: Path) -> None:
    assert helm("lint", "--strict", str(CHART), "-f", str(extra_values)).returncode == 0
    stages = yaml.safe_load(extra_values.read_text())["stages"]
    for bad, message in (
        ({"Face-Restore": stages[DUMMY.name]}, "Face-Restore"),  # not a name LIPLINE_<STAGE>_ADDRESS can carry
        ({DUMMY.name: {**stages[DUMMY.name], "replicaz": 2}}, "replicaz"),  # the per-stage keys stay strict
        ({DUMMY.name: {k: v for k, v in stages[DUMMY.name].items() if k != "dials"}}, "dials"),
        ({DUMMY.name: {**stages[DUMMY.name], "config": {"port": 1}}}, "port"),  # the chart sets it
    ):
        path = tmp_path / "bad-values.yaml"
        path.write_text(yaml.safe_dump({"stages": bad}))
        result = helm("template", "x", str(CHART), "-f", str(path), check=False)
        assert result.returncode != 0 and message in result.stderr, (bad, result.stderr[-2000:])
