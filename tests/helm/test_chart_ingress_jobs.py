"""The chart's optional way in and Jobs: an Ingress and a Gateway API GRPCRoute to the gateway, the
models-download hook Job (sha256-checked checkpoints onto the models claim) and the compile-cache
Jobs (one per GPU stage and release). Each renders only when enabled, passes `helm lint --strict`,
and validates strictly: built-in kinds against the Kubernetes 1.29 and 1.37 schemas (helpers of
test_chart.py), the GRPCRoute (a CRD) against the openAPIV3Schema of the Gateway API CRD, v1.1.0 (the
first with GRPCRoute v1) and v1.6.1, vendored in tests/helm/schemas/ and closed like
kubernetes-validate's strict mode (unknown fields rejected).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from services.tools.fetch_models import parse_items
from tests.helm.test_chart import (
    CHART,
    GPU_STAGES,
    KUBE_VERSIONS,
    _set_args,
    by_kind,
    container,
    env_of,
    helm,
    render,
    render_fails,
    validate_builtin,
)
from tests.helm.test_chart_values import notes

SCHEMAS = Path(__file__).parent / "schemas"
GATEWAY_API = "gateway.networking.k8s.io/"
GRPCROUTE_SCHEMAS = sorted(SCHEMAS.glob("gateway-api-*-grpcroute.json"))
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
CI = CHART / "ci"
SHA_A = "a" * 64
SHA_B = "0123456789ABCDEF" * 4
PARENT = '{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public", "namespace": "gateway-system", "sectionName": "https", "port": 443}'
ITEMS = (
    f'[{{"name": "wav2lip.pth", "url": "https://weights.example.com/w.pth?X-Amz-Signature=x", "sha256": "{SHA_A}"}},'
    f' {{"name": "sr/realesr-general-x4v3.pth", "url": "s3://weights/realesr.pth", "sha256": "{SHA_B}"}}]'
)
MODELS = ("models.existingClaim=lipline-models", "models.download.enabled=true", f"models.download.items:={ITEMS}")
WARM = ("compileCache.existingClaim=lipline-cc", "compileCache.warmJob.enabled=true")
INGRESS = (
    "ingress.enabled=true",
    "ingress.className=nginx",
    "ingress.hosts={api.example.com}",
    'ingress.tls:=[{"secretName": "api-tls", "hosts": ["api.example.com"]}]',
)
ROUTE = (
    "grpcRoute.enabled=true",
    f"grpcRoute.parentRefs:=[{PARENT}]",
    "grpcRoute.hostnames={api.example.com}",
    "grpcRoute.annotations.team=media",
)

VARIANTS: dict[str, tuple[tuple[str, ...], tuple[Path, ...]]] = {
    "ingress (ci)": ((), (CI / "ingress-values.yaml",)),
    "ingress pass-through (ci)": ((), (CI / "ingress-passthrough-values.yaml",)),
    "ingress, any host": (("ingress.enabled=true",), ()),
    "grpcroute": (ROUTE, ()),
    "models and compile jobs (ci)": ((), (CI / "models-jobs-values.yaml",)),
    "models and compile jobs on GPU pools": ((), (CI / "gpu-pools-values.yaml", CI / "models-jobs-values.yaml")),
    "all, sets": ((*INGRESS, *ROUTE, *MODELS, *WARM), ()),
}


def split(docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(built-in objects, Gateway API objects)."""
    builtin = [d for d in docs if not d["apiVersion"].startswith(GATEWAY_API)]
    return builtin, [d for d in docs if d["apiVersion"].startswith(GATEWAY_API)]


def _closed(schema: Any) -> Any:
    """The CRD schema made strict: objects with `properties` refuse other keys (the API server prunes
    them silently; a typo would be lost), as kubernetes-validate's strict mode does for built-in kinds."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


def grpcroute_validators() -> list[tuple[str, jsonschema.Draft7Validator]]:
    out = []
    for path in GRPCROUTE_SCHEMAS:
        schema = _closed(json.loads(path.read_text()))
        schema["properties"]["metadata"] = {"type": "object"}  # the CRD leaves metadata to the API server
        out.append((path.name, jsonschema.Draft7Validator(schema)))
    return out


def validate_grpcroute(doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == "gateway.networking.k8s.io/v1" and doc["kind"] == "GRPCRoute"
    for name, validator in grpcroute_validators():
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
        assert not errors, f"{name}: {[(list(e.path), e.message) for e in errors]}"


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    sets, files = VARIANTS[request.param]
    return request.param, render(*sets, values=files)


@pytest.fixture(scope="module")
def all_docs() -> list[dict[str, Any]]:
    return render(*VARIANTS["all, sets"][0])


# ---- every variant: lint, render, validate ----


def test_the_grpcroute_schemas_are_vendored() -> None:
    assert [p.name for p in GRPCROUTE_SCHEMAS] == [
        "gateway-api-v1.1.0-grpcroute.json",
        "gateway-api-v1.6.1-grpcroute.json",
    ]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_variants_validate_strictly(variant: tuple[str, list[dict[str, Any]]], kube_version: str) -> None:
    builtin, gateway_api = split(variant[1])
    assert validate_builtin(builtin, kube_version) > 10
    for doc in gateway_api:
        validate_grpcroute(doc)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variants_pass_helm_lint_strict(name: str) -> None:
    sets, files = VARIANTS[name]
    args = [a for f in files for a in ("-f", str(f))]
    result = helm("lint", "--strict", str(CHART), *args, *_set_args(sets), check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_grpcroute_check_catches_a_bad_route(all_docs: list[dict[str, Any]]) -> None:
    (route,) = by_kind(all_docs, "GRPCRoute").values()
    for breakage in ({"port": "443"}, {"sectionNme": "https"}):
        bad = copy.deepcopy(route)
        bad["spec"]["parentRefs"][0].update(breakage)
        with pytest.raises(AssertionError):
            validate_grpcroute(bad)


def test_defaults_render_no_ingress_route_nor_job() -> None:
    kinds = {d["kind"] for d in render()}
    assert not kinds & {"Ingress", "GRPCRoute", "Job"}


@pytest.mark.parametrize(
    "sets",
    [
        ("ingress.enabled=false", *INGRESS[1:]),
        ("grpcRoute.enabled=false", *ROUTE[1:]),
        ("models.download.enabled=false", *MODELS[:1], *MODELS[2:]),
        ("compileCache.warmJob.enabled=false", WARM[0]),
    ],
    ids=["ingress", "grpcroute", "download", "warm"],
)
def test_configured_but_disabled_renders_nothing(sets: tuple[str, ...]) -> None:
    assert not {d["kind"] for d in render(*sets)} & {"Ingress", "GRPCRoute", "Job"}


# ---- Ingress ----


def _ingress(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The gateway's Ingress (a values file may enable the web page's too: tests/helm/test_chart_web.py)."""
    (ing,) = [i for name, i in by_kind(docs, "Ingress").items() if name.endswith("-gateway")]
    return ing


def test_ingress_routes_grpc_to_the_gateway_service(all_docs: list[dict[str, Any]]) -> None:
    ing = _ingress(all_docs)
    service = by_kind(all_docs, "Service")["lip-lipline-gateway"]
    assert ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPC"
    assert ing["spec"]["ingressClassName"] == "nginx"
    assert ing["spec"]["tls"] == [{"secretName": "api-tls", "hosts": ["api.example.com"]}]
    (rule,) = ing["spec"]["rules"]
    assert rule["host"] == "api.example.com"
    (path,) = rule["http"]["paths"]
    assert path["path"] == "/" and path["pathType"] == "Prefix"
    assert path["backend"]["service"] == {"name": "lip-lipline-gateway", "port": {"name": "grpc"}}
    assert "grpc" in {p["name"] for p in service["spec"]["ports"]}


def test_ingress_from_the_ci_file_keeps_the_users_annotations_and_hosts() -> None:
    ing = _ingress(render(values=(CI / "ingress-values.yaml",)))
    notes_ = ing["metadata"]["annotations"]
    assert notes_["cert-manager.io/cluster-issuer"] == "letsencrypt"
    assert notes_["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "3600"
    assert [r["host"] for r in ing["spec"]["rules"]] == ["api.lipline.example.com", "api.eu.lipline.example.com"]


def test_ingress_without_hosts_answers_any_host() -> None:
    (rule,) = _ingress(render("ingress.enabled=true"))["spec"]["rules"]
    assert "host" not in rule
    assert "ingressClassName" not in _ingress(render("ingress.enabled=true"))["spec"]


def test_ingress_to_a_tls_gateway_speaks_grpcs() -> None:
    ing = _ingress(render(values=(CI / "ingress-passthrough-values.yaml",)))
    assert ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPCS"
    assert ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/ssl-passthrough"] == "true"
    assert "tls" not in ing["spec"]


def test_the_users_backend_protocol_wins() -> None:
    ing = _ingress(
        render("ingress.enabled=true", "ingress.annotations.nginx\\.ingress\\.kubernetes\\.io/backend-protocol=GRPCS")
    )
    assert ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPCS"


@pytest.mark.parametrize(
    "bad",
    [
        "ingress.hosts={Not_A_Host}",
        'ingress.tls:=[{"hosts": ["a.example.com"]}]',
        "ingress.tlsSecret=x",
        'grpcRoute.parentRefs:=[{"namespace": "x"}]',
        "grpcRoute.hostnames={-bad-}",
    ],
)
def test_the_schema_refuses_bad_way_in_values(bad: str) -> None:
    assert "values don't meet the specifications of the schema" in render_fails(bad)


def test_a_route_needs_a_gateway() -> None:
    assert "grpcRoute.parentRefs" in render_fails("grpcRoute.enabled=true")


# ---- GRPCRoute ----


def test_grpcroute_attaches_the_gateway_service(all_docs: list[dict[str, Any]]) -> None:
    (route,) = by_kind(all_docs, "GRPCRoute").values()
    assert route["metadata"]["name"] == "lip-lipline-gateway"
    assert route["metadata"]["annotations"] == {"team": "media"}
    assert route["spec"]["parentRefs"] == [json.loads(PARENT)]
    assert route["spec"]["hostnames"] == ["api.example.com"]
    assert route["spec"]["rules"] == [
        {"backendRefs": [{"name": "lip-lipline-gateway", "port": VALUES["stages"]["gateway"]["port"]}]}
    ]


# ---- the models-download Job ----


def _download_job(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = (j for j in by_kind(docs, "Job").values() if j["metadata"]["name"].endswith("-models-download"))
    return job


def _args_of(job: dict[str, Any]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """The Job's items (name, url, sha256), then its --require paths."""
    args = container(job)["args"]
    assert args[:5] == ["python", "-m", "services.tools.fetch_models", "--dest", "/models"]
    rest = args[5:]
    cut = rest.index("--require") if "--require" in rest else len(rest)
    items, required = rest[:cut], rest[cut:]
    assert items[::4] == ["--item"] * (len(items) // 4) and len(items) % 4 == 0
    assert required[::2] == ["--require"] * (len(required) // 2) and len(required) % 2 == 0
    return [tuple(items[i + 1 : i + 4]) for i in range(0, len(items), 4)], required[1::2]


def _items_of(job: dict[str, Any]) -> list[tuple[str, str, str]]:
    return _args_of(job)[0]


def test_the_download_job_requires_what_the_enabled_stages_load() -> None:
    """Each enabled stage's relative checkpoint paths, once: the tier's only while it is enabled."""
    sets = (*VARIANTS["all, sets"][0], "stages.superres.config.checkpoint=/elsewhere/sr.pth")
    _, required = _args_of(_download_job(render(*sets)))
    assert "musetalkV15/unet.pth" not in required and not [p for p in required if p.startswith("/")]
    _, with_tier = _args_of(_download_job(render(*sets, "stages.lipsync-musetalk.enabled=true")))
    tier = ["musetalkV15/unet.pth", "musetalkV15/musetalk.json", "sd-vae", "whisper"]
    assert set(tier) <= set(with_tier) and len(with_tier) == len(set(with_tier))
    assert set(with_tier) - set(required) == {*tier, "face-parse-bisent/79999_iter.pth", "dwpose/dw-ll_ucoco_384.pth"}


def test_the_download_job_carries_every_item_and_its_sha256(all_docs: list[dict[str, Any]]) -> None:
    job = _download_job(all_docs)
    items = _items_of(job)
    assert items == [
        ("wav2lip.pth", "https://weights.example.com/w.pth?X-Amz-Signature=x", SHA_A),
        ("sr/realesr-general-x4v3.pth", "s3://weights/realesr.pth", SHA_B.lower()),
    ]
    assert [i.sha256 for i in parse_items(items)] == [SHA_A, SHA_B.lower()]  # the script accepts them


def test_the_download_job_is_a_pre_install_hook_writing_the_models_claim(all_docs: list[dict[str, Any]]) -> None:
    job = _download_job(all_docs)
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "default"
    assert pod["securityContext"]["runAsUser"] == 10001 and pod["securityContext"]["fsGroup"] == 10001
    c = container(job)
    assert c["image"] == "ghcr.io/lipline/lipline-gateway:0.1.0"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["models"]["mountPath"] == "/models" and not mounts["models"].get("readOnly")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "lipline-models"}
    # The stages' pods keep mounting it read-only.
    for d in by_kind(all_docs, "Deployment").values():
        for m in container(d)["volumeMounts"]:
            if m["name"] == "models":
                assert m["readOnly"] is True


def test_the_download_job_from_the_ci_file_gets_s3_settings_and_its_own_identity() -> None:
    job = _download_job(render(values=(CI / "models-jobs-values.yaml",)))
    env = env_of(job)
    assert env["AWS_ACCESS_KEY_ID"] == "secret:lipline-weights-s3/AWS_ACCESS_KEY_ID"
    assert env["AWS_SECRET_ACCESS_KEY"] == "secret:lipline-weights-s3/AWS_SECRET_ACCESS_KEY"
    assert env["AWS_ENDPOINT_URL"] == "https://minio.storage.svc:9000" and env["AWS_REGION"] == "eu-west-1"
    assert container(job)["image"] == "registry.internal/lipline/lipline-gateway:0.1.0"
    pod = job["spec"]["template"]["spec"]
    assert (
        pod["serviceAccountName"] == "lipline-weights"
        and pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    )
    assert job["spec"]["backoffLimit"] == 3 and job["spec"]["activeDeadlineSeconds"] == 1800
    assert container(job)["resources"]["limits"] == {"memory": "256Mi"}
    assert [i[2] for i in _items_of(job)] == ["0123456789abcdef" * 4, "fedcba9876543210" * 4]


def test_the_download_job_gets_the_chart_wide_proxy_and_volumes() -> None:
    job = _download_job(render(*MODELS, values=(CI / "gpu-pools-values.yaml",)))
    assert env_of(job)["HTTPS_PROXY"] == "http://proxy.internal:3128"
    assert "ca-bundle" in {m["name"] for m in container(job)["volumeMounts"]}


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("models.download.enabled=true", f"models.download.items:={ITEMS}"), "needs models.existingClaim"),
        (("models.existingClaim=m", "models.download.enabled=true"), "needs models.download.items"),
        (
            (
                "models.existingClaim=m",
                "models.download.enabled=true",
                f'models.download.items:=[{{"name": "a.pth", "url": "https://x/a", "sha256": "{SHA_A}"}}, '
                f'{{"name": "a.pth", "url": "https://x/b", "sha256": "{SHA_A}"}}]',
            ),
            "a.pth appears twice",
        ),
    ],
    ids=["no claim", "no items", "a name twice"],
)
def test_the_download_job_refuses_incomplete_values(sets: tuple[str, ...], message: str) -> None:
    assert message in render_fails(*sets)


@pytest.mark.parametrize(
    "item",
    [
        '{"name": "w.pth", "url": "https://x/w", "sha256": "abc"}',
        '{"name": "w.pth", "url": "ftp://x/w", "sha256": "' + SHA_A + '"}',
        '{"name": "../w.pth", "url": "https://x/w", "sha256": "' + SHA_A + '"}',
        '{"name": "w.pth", "url": "https://x/w"}',
        '{"name": "w.pth", "url": "https://x/w", "sha256": "' + SHA_A + '", "md5": "x"}',
    ],
    ids=["short hash", "ftp", "dot-dot", "no hash", "unknown key"],
)
def test_the_schema_refuses_bad_items(item: str) -> None:
    stderr = render_fails("models.existingClaim=m", "models.download.enabled=true", f"models.download.items:=[{item}]")
    assert "values don't meet the specifications of the schema" in stderr


# ---- the compile-cache Jobs ----


def _warm_jobs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        j["metadata"]["labels"]["app.kubernetes.io/component"].removesuffix("-warm-cache"): j
        for j in by_kind(docs, "Job").values()
        if j["metadata"]["name"].endswith("-warm-1")
    }


def test_one_compile_job_per_gpu_stage_named_with_the_revision(all_docs: list[dict[str, Any]]) -> None:
    jobs = _warm_jobs(all_docs)
    assert sorted(jobs) == sorted(GPU_STAGES) and GPU_STAGES
    for stage, job in jobs.items():
        assert job["metadata"]["name"] == f"lip-lipline-{stage}-warm-1"
        assert "helm.sh/hook" not in job["metadata"].get("annotations", {})
    assert ".Release.Revision" in (CHART / "templates" / "compile-cache-job.yaml").read_text()


def test_the_compile_job_runs_the_stage_image_in_warm_only_mode(all_docs: list[dict[str, Any]]) -> None:
    deployments = by_kind(all_docs, "Deployment")
    for stage, job in _warm_jobs(all_docs).items():
        c, d = container(job), container(deployments[f"lip-lipline-{stage}"])
        assert c["image"] == d["image"]
        assert c["args"] == ["python", "-m", f"services.{stage}", "--backend", "compile", "--warm-cache-only", "true"]
        env = env_of(job)
        assert env["LIPLINE_BACKEND"] == "compile" and env["LIPLINE_DEVICE"] == "cuda"
        assert env["LIPLINE_COMPILE_CACHE_DIR"] == "/var/cache/lipline"
        assert env["LIPLINE_CHECKPOINT"] == env_of(deployments[f"lip-lipline-{stage}"])["LIPLINE_CHECKPOINT"]
        assert not {k for k in env if k.endswith("_FILE")}  # serves nothing: no keys, token nor TLS files
        assert c["resources"] == d["resources"]  # the GPU request of the stage
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["compile-cache"]["mountPath"] == "/var/cache/lipline" and not mounts["compile-cache"].get(
            "readOnly"
        )
        assert mounts["models"]["readOnly"] is True
        volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
        assert volumes["compile-cache"]["persistentVolumeClaim"] == {"claimName": "lipline-cc"}
        assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "lipline-models", "readOnly": True}


def test_no_stage_object_selects_a_compile_job_pod(all_docs: list[dict[str, Any]]) -> None:
    jobs = _warm_jobs(all_docs)
    selectors = [s["spec"]["selector"] for s in by_kind(all_docs, "Service").values() if s["spec"].get("selector")]
    selectors += [p["spec"]["podSelector"]["matchLabels"] for p in by_kind(all_docs, "NetworkPolicy").values()]
    selectors += [p["spec"]["selector"]["matchLabels"] for p in by_kind(all_docs, "PodDisruptionBudget").values()]
    for job in jobs.values():
        labels = job["spec"]["template"]["metadata"]["labels"]
        for selector in selectors:
            assert not selector.items() <= labels.items(), (job["metadata"]["name"], selector)


def test_the_compile_jobs_go_where_their_stage_goes() -> None:
    docs = render(*WARM, values=(CI / "gpu-pools-values.yaml",))  # nameOverride lip: objects are lip-<stage>
    deployments = by_kind(docs, "Deployment")
    for stage, job in _warm_jobs(docs).items():
        pod, dpod = job["spec"]["template"]["spec"], deployments[f"lip-{stage}"]["spec"]["template"]["spec"]
        for key in ("nodeSelector", "tolerations", "runtimeClassName", "priorityClassName"):
            assert pod.get(key) == dpod.get(key), (stage, key)
        assert container(job)["resources"]["limits"] == container(deployments[f"lip-{stage}"])["resources"]["limits"]
        assert "topologySpreadConstraints" not in pod
        assert set(pod.get("affinity", {})) <= {"nodeAffinity"}
    assert "nvidia.com/gpu.shared" in container(_warm_jobs(docs)["superres"])["resources"]["limits"]


def test_compile_job_names_stay_within_63_characters() -> None:
    jobs = _warm_jobs(render(*WARM, *MODELS, "fullnameOverride=" + "x" * 50))
    assert jobs and all(
        len(j["metadata"]["name"]) <= 63 and j["metadata"]["name"].endswith("-warm-1") for j in jobs.values()
    )
    download = render(*MODELS, "fullnameOverride=" + "x" * 50)
    assert all(len(j["metadata"]["name"]) <= 63 for j in by_kind(download, "Job").values())


def test_the_compile_job_needs_a_cache_claim() -> None:
    assert "needs compileCache.existingClaim" in render_fails("compileCache.warmJob.enabled=true")


def test_the_compile_job_without_weights_compiles_the_fallbacks() -> None:
    jobs = _warm_jobs(render(*WARM))
    for job in jobs.values():
        assert "LIPLINE_CHECKPOINT" not in env_of(job)
        assert "models" not in {v["name"] for v in job["spec"]["template"]["spec"]["volumes"]}


# ---- NOTES and docs ----


def test_notes_name_the_way_in_and_the_jobs(tmp_path: Path) -> None:
    text = notes(tmp_path, *INGRESS, *ROUTE, *MODELS, *WARM)
    assert "api.example.com:443" in text and "backend-protocol GRPC" in text
    assert "GRPCRoute lip-lipline-gateway on Gateway gateway-system/public (https)" in text
    assert "wav2lip.pth, sr/realesr-general-x4v3.pth" in text
    for stage in GPU_STAGES:
        assert f"job/lip-lipline-{stage}-warm-1" in text
    plain = notes(tmp_path / "2")
    assert "Ingress" not in plain and "GRPCRoute" not in plain and "COMPILE CACHE" not in plain


def test_the_chart_readme_explains_access_modes_and_the_jobs() -> None:
    readme = (CHART / "README.md").read_text()
    for words in (
        "ReadWriteMany",
        "ReadOnlyMany",
        "fsGroupChangePolicy",
        "models.download",
        "compileCache.warmJob",
        "--warm-cache-only",
        "GRPCS",
        "GRPCRoute",
    ):
        assert words in readme, words
