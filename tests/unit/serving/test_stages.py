"""services.serving.stages, the one list of stages, and everything that repeats it: the chart's values,
the services' default ports, the Dockerfile, the image build, the schema generator, the local cluster."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType

import pytest
import yaml

from services.serving import stages as registry
from services.serving.stages import (
    DEFAULT_TIER,
    STAGES,
    Stage,
    called_stages,
    gpu_stages,
    image_stages,
    public_stages,
    stage,
    start_order,
    tier_stage,
    tiers,
)

REPO = Path(__file__).resolve().parents[3]
VALUES = yaml.safe_load((REPO / "helm" / "lipline" / "values.yaml").read_text())["stages"]


def _script(name: str):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def test_the_chart_has_the_registrys_stages_in_its_order() -> None:
    assert list(VALUES) == list(STAGES)


@pytest.mark.parametrize("name", list(STAGES))
def test_the_charts_traits_are_the_registrys(name: str) -> None:
    s, v = STAGES[name], VALUES[name]
    assert (v["port"], v["metricsPort"]) == (s.port, s.metrics_port)
    assert (v["gpu"] > 0) == s.gpu
    assert v["public"] == s.public
    assert v["stores"] == s.stores
    assert ("cache" in v) == s.cache
    assert list(v["dials"]) == list(s.calls)
    assert v.get("httpPort", 0) == s.http_port


# A live worker's own address, as the gateway dials it (advertised in the job store): not a stage it dials.
OWN_ADDRESSES = {"advertise_address"}


def test_the_services_default_ports_and_addresses_are_the_registrys() -> None:
    classes = _script("gen_chart_schema").settings_classes()
    assert list(classes) == list(STAGES)
    for name, cls in classes.items():
        defaults = cls()
        assert (defaults.port, defaults.metrics_port) == (STAGES[name].port, STAGES[name].metrics_port), name
        for called in STAGES[name].calls:  # a caller's default address of each stage it dials
            # an optional stage's is empty: not deployed unless configured
            expected = "" if STAGES[called].optional else STAGES[called].local_address
            assert getattr(defaults, f"{called.replace('-', '_')}_address") == expected, (name, called)
        dialled = {
            f.name.removesuffix("_address").replace("_", "-")
            for f in dataclasses.fields(cls)
            if f.name.endswith("_address") and f.name not in OWN_ADDRESSES
        }
        assert dialled == set(STAGES[name].calls), name


def test_the_dockerfile_exposes_every_port_and_names_every_stage() -> None:
    dockerfile = (REPO / "services" / "Dockerfile").read_text()
    (exposed,) = re.findall(r"^EXPOSE (.+)$", dockerfile, re.M)
    assert {int(p) for p in exposed.split()} == {
        p for s in STAGES.values() for p in (s.port, s.metrics_port, s.http_port) if p
    }
    (usage,) = re.findall(r"--build-arg SERVICE=([a-z|]+)", dockerfile)
    assert usage.split("|") == list(image_stages())


def test_the_image_build_and_the_server_read_the_registry() -> None:
    from services.serving.server import PUBLIC_STAGES

    ir = _script("image_requirements")
    assert ir.GPU_SERVICES == set(image_stages(gpu=True)) == {"lipsync", "superres"}
    assert set(gpu_stages()) == {"lipsync", "lipsync-musetalk", "superres"}
    assert set(ir.EXCLUDED) == set(image_stages())
    assert PUBLIC_STAGES == public_stages() == {"gateway"}


def test_the_makefile_builds_one_image_per_stage_on_its_runtime() -> None:
    run = [sys.executable, "-m", "services.serving.stages"]
    out = {
        flag: subprocess.run([*run, *flag], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
        for flag in ((), ("--gpu",), ("--cpu",))
    }
    assert out[()] == list(STAGES) and out[("--gpu",)] == list(image_stages(gpu=True))
    assert sorted(out[("--gpu",)] + out[("--cpu",)]) == sorted(image_stages())
    makefile = (REPO / "Makefile").read_text()
    assert "-m services.serving.stages --cpu" in makefile and "-m services.serving.stages --gpu" in makefile
    assert not re.search(r"for s in [a-z ]+;", makefile), "the image lists come from the registry"


def test_the_local_cluster_reads_the_registry() -> None:
    from services.local.cluster import CALLS
    from services.local.cluster import STAGES as CLUSTER_STAGES

    assert CLUSTER_STAGES == called_stages() == ("audio", "lipsync", "lipsync-musetalk", "superres")
    assert CALLS == {
        "render": ("lipsync", "lipsync-musetalk", "superres"),
        "live": ("lipsync", "lipsync-musetalk", "superres"),
        "gateway": ("audio", "lipsync", "lipsync-musetalk"),
        "web": ("gateway",),
    }


def test_start_order_puts_every_stage_after_what_it_calls() -> None:
    waves = start_order()
    assert waves == [["audio", "lipsync", "lipsync-musetalk", "superres"], ["render", "live", "gateway"], ["web"]]
    wave_of = {name: i for i, wave in enumerate(waves) for name in wave}
    for s in STAGES.values():
        assert all(wave_of[c] < wave_of[s.name] for c in s.calls)
    assert start_order(["gateway", "audio"]) == [["audio"], ["gateway"]]


def test_a_stage_added_to_the_registry_joins_the_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dummy stage: it gets its place in the start order, the image lists and the chart's schema."""
    dummy = Stage(
        "facerestore",
        port=50065,
        metrics_port=9096,
        settings="services.serving.settings:ModelStageSettings",
        gpu=True,
        calls=("superres",),
    )
    monkeypatch.setattr(registry, "STAGES", MappingProxyType({**STAGES, dummy.name: dummy}))
    assert start_order()[-2] == ["render", "live", "gateway", "facerestore"]
    assert gpu_stages() == ("lipsync", "lipsync-musetalk", "superres", "facerestore")
    assert stage("facerestore").image == "lipline-facerestore" and dummy.module == "services.facerestore"
    schema = _script("gen_chart_schema").build()["properties"]["stages"]
    assert "facerestore" in schema["required"]
    assert "max_batch" in schema["properties"]["facerestore"]["properties"]["config"]["propertyNames"]["enum"]


def test_the_musetalk_tier_is_a_second_stage_of_the_lipsync_image() -> None:
    """Its own Deployment, ports and settings, the lipsync image, `python -m services.lipsync.musetalk`;
    no image of its own to build; optional (callers' default address empty); it serves the musetalk tier."""
    s = STAGES["lipsync-musetalk"]
    assert s.gpu and s.optional and s.image == STAGES["lipsync"].image == "lipline-lipsync"
    assert s.module == "services.lipsync.musetalk" and STAGES["lipsync"].module == "services.lipsync"
    assert "lipsync-musetalk" not in image_stages() and "lipsync" in image_stages(gpu=True)
    assert tiers() == ("wav2lip", "musetalk") and DEFAULT_TIER == "wav2lip"
    assert tier_stage("musetalk") is s and tier_stage("wav2lip") is STAGES["lipsync"]
    with pytest.raises(ValueError, match="unknown model 'sadtalker': one of wav2lip, musetalk"):
        tier_stage("sadtalker")


def test_a_local_cluster_starts_an_optional_stage_only_where_asked(tmp_path: Path) -> None:
    """Replicas 0 by default: the gateway gets an empty address (the tier is not served), also with
    address files (no file nobody writes); replica names of a stage with a hyphen in its name."""
    from services.local.cluster import LocalCluster, started_stages

    cluster = LocalCluster(tmp_path, address_files=True)
    assert cluster.replica_names("lipsync-musetalk") == []
    assert cluster.stages == started_stages() == ("audio", "lipsync", "superres")  # what health loops iterate
    args = cluster.store_args("gateway")
    assert args[-3].startswith("--audio-address=file://") and args[-1] == "--lipsync-musetalk-address="
    asked = LocalCluster(tmp_path, replicas={"lipsync-musetalk": 2})
    assert asked.replica_names("lipsync-musetalk") == ["lipsync-musetalk", "lipsync-musetalk-1"]
    assert asked.stages == ("audio", "lipsync", "lipsync-musetalk", "superres")
    assert [asked.service_of(n) for n in ("lipsync-musetalk-1", "lipsync-musetalk", "render-1", "gateway")] == [
        "lipsync-musetalk",
        "lipsync-musetalk",
        "render",
        "gateway",
    ]


def test_the_registry_refuses_unknown_calls_shared_ports_and_cycles(monkeypatch: pytest.MonkeyPatch) -> None:
    a = Stage("a", port=1, metrics_port=2, settings="x:Y", calls=("b",))
    with pytest.raises(ValueError, match="unknown stage 'b'"):
        registry._registry(a)
    with pytest.raises(ValueError, match="port is used twice"):
        registry._registry(Stage("a", 1, 2, "x:Y"), Stage("b", 3, 1, "x:Y"))
    with pytest.raises(ValueError, match="unknown stage 'nope'"):
        stage("nope")
    b = Stage("b", port=3, metrics_port=4, settings="x:Y", calls=("a",))
    monkeypatch.setattr(registry, "STAGES", registry._registry(a, b))
    with pytest.raises(ValueError, match="cycle"):
        start_order()


def test_the_registry_imports_neither_torch_nor_grpc() -> None:
    code = "import services.serving.stages, sys; sys.exit(bool({'torch', 'grpc', 'numpy'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
