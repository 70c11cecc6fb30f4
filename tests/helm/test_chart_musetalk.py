"""The chart's lipsync-musetalk stage (the 256 px tier, issue 30): off by default, and when enabled a
Deployment of the lipsync image running services.lipsync.musetalk with its checkpoints on the models
volume, its Service, HPA, NetworkPolicy (its callers: the gateway, the render and live workers) and
their addresses of it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from services.lipsync.musetalk.settings import MuseTalkSettings
from services.serving.settings import parse_settings
from services.serving.stages import STAGES as REGISTRY
from tests.helm.test_chart import (
    KUBE_VERSIONS,
    _grpc_callers,
    by_kind,
    container,
    env_of,
    render,
    validate_builtin,
)

ON = ("stages.lipsync-musetalk.enabled=true",)
MODELS = ("models.existingClaim=lipline-models",)
NAME = "lip-lipline-lipsync-musetalk"


def objects(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs if "musetalk" in d["metadata"]["name"]}


def test_off_by_default_and_the_gateway_then_has_no_address_of_it() -> None:
    docs = render()
    assert objects(docs) == set()
    for caller in ("gateway", "render", "live"):
        assert "LIPLINE_LIPSYNC_MUSETALK_ADDRESS" not in env_of(by_kind(docs, "Deployment")[f"lip-lipline-{caller}"])


@pytest.fixture(scope="module")
def enabled() -> list[dict[str, Any]]:
    return render(*ON, *MODELS)


def test_enabled_it_is_a_gpu_deployment_of_the_lipsync_image_with_its_objects(enabled: list[dict[str, Any]]) -> None:
    assert objects(enabled) == {
        ("Deployment", NAME),
        ("Service", NAME),
        ("HorizontalPodAutoscaler", NAME),
        ("NetworkPolicy", NAME),
    }  # a PDB where more than one replica runs (minReplicas 1 here): test_pdbs_never_pin_a_single_replica
    c = container(by_kind(enabled, "Deployment")[NAME])
    assert c["image"].startswith("ghcr.io/lipline/lipline-lipsync:") and c["args"] == [
        "python",
        "-m",
        "services.lipsync.musetalk",
    ]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {p["containerPort"] for p in c["ports"]} == {
        REGISTRY["lipsync-musetalk"].port,
        REGISTRY["lipsync-musetalk"].metrics_port,
    }
    hpa = by_kind(enabled, "HorizontalPodAutoscaler")[NAME]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "lipline_gpu_utilization_ratio"
    assert by_kind(enabled, "Service")[NAME]["spec"]["clusterIP"] == "None"
    policy = by_kind(enabled, "NetworkPolicy")[NAME]
    assert _grpc_callers(policy) == {"gateway", "render", "live"}
    for caller in ("gateway", "render", "live"):
        env = env_of(by_kind(enabled, "Deployment")[f"lip-lipline-{caller}"])
        assert env["LIPLINE_LIPSYNC_MUSETALK_ADDRESS"] == "dns:///lip-lipline-lipsync-musetalk.media.svc:50068"
    for kube_version in KUBE_VERSIONS:
        validate_builtin(enabled, kube_version)


def test_its_settings_are_real_and_its_checkpoints_are_on_the_models_volume(enabled: list[dict[str, Any]]) -> None:
    env = env_of(by_kind(enabled, "Deployment")[NAME])
    fields = {f"LIPLINE_{f.name.upper()}" for f in dataclasses.fields(MuseTalkSettings)}
    assert not {k for k in env if k.startswith("LIPLINE_")} - fields
    settings = parse_settings(MuseTalkSettings, [], environ=env)
    assert settings.has_generator and settings.port == 50068
    assert (settings.unet, settings.vae, settings.dwpose) == (
        "/models/musetalkV15/unet.pth",
        "/models/sd-vae",
        "/models/dwpose/dw-ll_ucoco_384.pth",
    )
    without = env_of(by_kind(render(*ON), "Deployment")[NAME])  # no models volume: the stand-in
    assert not {"LIPLINE_UNET", "LIPLINE_VAE", "LIPLINE_WHISPER", "LIPLINE_FACE_PARSER"} & set(without)
    assert not parse_settings(MuseTalkSettings, [], environ=without).has_generator


def test_its_compile_job_runs_its_module_and_long_names_stay_within_63_characters() -> None:
    docs = render(
        *ON,
        *MODELS,
        "compileCache.existingClaim=cache",
        "compileCache.warmJob.enabled=true",
        "fullnameOverride=" + "x" * 50,
    )
    (job,) = [j for n, j in by_kind(docs, "Job").items() if "lipsync-musetalk" in n]
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["args"][:3] == ["python", "-m", "services.lipsync.musetalk"] and "--warm-cache-only" in c["args"]
    names = [d["metadata"]["name"] for d in docs if "lipsync-musetalk" in d["metadata"]["name"]]
    assert len(names) == 5 and all(len(n) <= 63 for n in names)
    jobs = [d["metadata"]["name"] for d in docs if d["kind"] == "Job"]
    assert len(jobs) == len(set(jobs)) == 3  # lipsync's, lipsync-musetalk's and superres': never one name
    assert f"{'x' * 50}-lipsync" in by_kind(docs, "Deployment")  # the Wav2Lip stage's name is unchanged
