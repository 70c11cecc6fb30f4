"""The Helm chart, rendered by a real helm binary and every manifest checked against the Kubernetes schemas.

`helm lint` and `helm template` run for real (the binary scripts/install_helm.py puts in .venv/bin);
every rendered object of a built-in kind is validated strictly (unknown fields rejected) against
the Kubernetes 1.29 and 1.37 OpenAPI schemas bundled with kubernetes-validate; the prometheus-operator
and KEDA objects are checked for what Prometheus and KEDA need from them. The chart renders as on a
cluster with the Prometheus operator (`--api-versions monitoring.coreos.com/v1`) unless a test says
otherwise; tests/helm/test_chart_values.py covers the values users set (ci/*-values.yaml) and the
cluster without it. Then what matters to an
operator: GPU requests, probes, non-root read-only pods, the stores (single-node try-out, PostgreSQL
from a Secret, a ReadWriteMany claim, S3), HPAs on the adapter's metrics, network isolation, and
that every LIPLINE_* variable the chart sets is a setting the service really has.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from services.serving.stages import STAGES as STAGE_REGISTRY
from services.serving.stages import gpu_stages
from tests.helpers.tools import helm_binary

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "lipline"
KUBE_VERSION = "1.29.0"
# The newest schema kubernetes-validate bundles that the chart is also checked against.
NEWEST_KUBE_VERSION = "1.37.0"
KUBE_VERSIONS = tuple(v for v in (KUBE_VERSION, NEWEST_KUBE_VERSION) if v in kubernetes_validate.utils.all_versions())
# The Prometheus operator's API: ServiceMonitor and PrometheusRule render only where it is served.
OPERATOR_API = "monitoring.coreos.com/v1"
# The stage registry (values.yaml is checked against it in test_chart_registry.py).
# A default install deploys the registry's stages less the optional ones (stages.<name>.enabled false:
# lipsync-musetalk; tests/helm/test_chart_musetalk.py renders it enabled).
STAGES = tuple(name for name, s in STAGE_REGISTRY.items() if not s.optional)
GPU_STAGES = tuple(s for s in gpu_stages() if s in STAGES)
STORE_STAGES = tuple(name for name in STAGES if STAGE_REGISTRY[name].stores)
# Who may call whom (docs/architecture.md sections 1 and 10): the NetworkPolicies must say exactly
# this. The gateway calls the live workers at the pod addresses they advertise in the job store.
CALLERS = {
    "audio": {"gateway"},
    "lipsync": {"gateway", "render", "live"},
    "superres": {"render", "live"},
    "render": set(),
    "live": {"gateway"},
}
SQLITE = "sqlite:////var/lib/lipline/lipline.db"


def _gen_chart_schema() -> Any:
    """scripts/gen_chart_schema.py, which writes values.schema.json from the services' settings."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gen_chart_schema
    finally:
        sys.path.pop(0)
    return gen_chart_schema


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HELM_CACHE_HOME": "/tmp/lipline-helm/cache",
        "HELM_CONFIG_HOME": "/tmp/lipline-helm/config",
        "HELM_DATA_HOME": "/tmp/lipline-helm/data",
    }
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=60, check=check, env=env)


def _set_args(sets: tuple[str, ...]) -> list[str]:
    args = []
    for s in sets:  # "key=value"; "key:=json" for numbers --set would pass as strings
        args += ["--set-json", s.replace(":=", "=", 1)] if ":=" in s else ["--set", s]
    return args


def render(
    *sets: str,
    release: str = "lip",
    api_versions: tuple[str, ...] = (OPERATOR_API,),
    values: tuple[Path, ...] = (),
    kube_version: str = KUBE_VERSION,
) -> list[dict[str, Any]]:
    """`helm template` of the chart: `values` files first, then the --set/--set-json `sets`."""
    args = ["template", release, str(CHART), "--namespace", "media", "--kube-version", kube_version]
    for api in api_versions:
        args += ["--api-versions", api]
    for path in values:
        args += ["-f", str(path)]
    out = helm(*args, *_set_args(sets)).stdout
    return [doc for doc in yaml.load_all(out, Loader=yaml.CSafeLoader) if doc]  # libyaml: 8x faster


def render_fails(*sets: str) -> str:
    """helm template's error output for values the chart must refuse."""
    result = helm("template", "x", str(CHART), *_set_args(sets), check=False)
    assert result.returncode != 0, f"{sets} was accepted"
    return result.stderr


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def env_of(deployment: dict[str, Any]) -> dict[str, str]:
    """Plain env values; a variable from a Secret reads `secret:<name>/<key>`, from a field `field:<path>`."""
    out = {}
    names = [e["name"] for e in container(deployment)["env"]]
    assert len(names) == len(set(names)), f"{deployment['metadata']['name']}: a variable is set twice: {names}"
    for e in container(deployment)["env"]:
        if "value" in e:
            out[e["name"]] = e["value"]
        elif "secretKeyRef" in e["valueFrom"]:
            ref = e["valueFrom"]["secretKeyRef"]
            out[e["name"]] = f"secret:{ref['name']}/{ref['key']}"
        else:
            out[e["name"]] = f"field:{e['valueFrom']['fieldRef']['fieldPath']}"
    return out


def volumes_of(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}


def mounts_of(deployment: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container(deployment)["volumeMounts"]}


PG_SECRET = ("store.jobStore.existingSecret=lipline-pg", "store.jobStore.secretKey=dsn")
RWX = ("store.blobStore.persistence.existingClaim=lipline-blobs",)
S3 = (
    "store.blobStore.url=s3://lipline-media/prod",
    "store.blobStore.s3.existingSecret=lipline-s3",
    "store.blobStore.s3.endpoint=https://minio.storage.svc:9000",
    "store.blobStore.s3.region=eu-west-1",
)

VARIANTS = {
    "defaults": (),
    "PostgreSQL from a Secret, RWX blobs, volumes, no autoscaling, no monitoring": (
        *PG_SECRET,
        *RWX,
        "store.local.enabled=false",
        "models.existingClaim=lipline-models",
        "compileCache.existingClaim=lipline-compile-cache",
        "stages.lipsync.autoscaling.enabled=false",
        "stages.superres.autoscaling.enabled=false",
        "stages.audio.autoscaling.enabled=false",
        "stages.render.autoscaling.enabled=false",
        "stages.live.autoscaling.enabled=false",
        "monitoring.serviceMonitor.enabled=false",
        "monitoring.prometheusRule.enabled=false",
        "networkPolicy.enabled=false",
        "gpu.runtimeClassName=nvidia",
    ),
    "S3 with a credentials Secret, dev DSN": (
        "store.jobStore.url=postgresql://lipline:secret@pg.db.svc:5432/lipline",
        *S3,
    ),
    "KEDA, PostgreSQL": (
        "keda.enabled=true",
        *PG_SECRET,
        *S3,
        "stages.superres.autoscaling.metric=queue",
        "stages.superres.autoscaling.target:=0.02",
        "stages.lipsync.autoscaling.minReplicas=2",
    ),
    "KEDA, SQLite": (
        "keda.enabled=true",
        "stages.superres.autoscaling.metric=queue",
        "stages.superres.autoscaling.target:=0.02",
    ),
    "queue-time autoscaling, gateway LoadBalancer, gatewayFrom": (
        "stages.lipsync.autoscaling.metric=queue",
        "stages.lipsync.autoscaling.target:=0.05",
        "stages.gateway.service.type=LoadBalancer",
        "stages.gateway.autoscaling.enabled=true",
        'networkPolicy.gatewayFrom:=[{"namespaceSelector": {"matchLabels": {"team": "product"}}}]',
        *PG_SECRET,
        *RWX,
    ),
}


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(*VARIANTS[request.param])


@pytest.fixture(scope="module")
def default_docs() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def pg_rwx_docs() -> list[dict[str, Any]]:
    return render(*VARIANTS["PostgreSQL from a Secret, RWX blobs, volumes, no autoscaling, no monitoring"])


@pytest.fixture(scope="module")
def s3_docs() -> list[dict[str, Any]]:
    return render(*VARIANTS["S3 with a credentials Secret, dev DSN"])


@pytest.mark.parametrize(
    "sets",
    [(), (*PG_SECRET, *S3, "store.local.enabled=false", "keda.enabled=true")],
    ids=["defaults", "production stores, KEDA"],
)
def test_helm_lint_passes_strict(sets: tuple[str, ...]) -> None:
    result = helm("lint", "--strict", str(CHART), *_set_args(sets), check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def validate_builtin(docs: list[dict[str, Any]], kube_version: str) -> int:
    """Validate every object of a built-in kind strictly against `kube_version`'s schemas; how many."""
    checked = 0
    for doc in docs:
        if doc["apiVersion"].startswith(("monitoring.coreos.com/", "keda.sh/")):
            continue  # CRDs: not in the core schemas, checked below
        try:
            kubernetes_validate.validate(doc, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{kube_version}: {doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
        checked += 1
    return checked


def test_the_newest_kubernetes_schema_is_bundled() -> None:
    """kubernetes-validate 1.37 bundles the 1.37 schemas; the chart is checked against them too."""
    assert NEWEST_KUBE_VERSION in KUBE_VERSIONS, kubernetes_validate.utils.all_versions()[-3:]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_builtin_manifest_matches_the_kubernetes_schema(
    rendered: list[dict[str, Any]], kube_version: str
) -> None:
    assert validate_builtin(rendered, kube_version) >= 12


def test_the_validator_rejects_a_broken_manifest(default_docs: list[dict[str, Any]]) -> None:
    """The schema check above could fail: a wrong type in a rendered Deployment is caught."""
    deployment = next(d for d in default_docs if d["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["revisionHistoryLimit"] = "five"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSION, strict=True)


def test_values_schema_rejects_bad_values() -> None:
    for bad in (
        "stages.lipsync.autoscaling.metric=memory",
        "stages.lipsync.gpu=-1",
        "image.pullPolicy=Sometimes",
        "stages.superres.port=70000",
        "stages.lipsync.config.no_such_setting=1",
        "monitoring.serviceMonitor.enabeld=false",
        "stages.lipsync.pdb.minAvailabel=1",
        "stages.render.config.x264_presett=fast",
        "stages.render.config.job_store=sqlite:///x.db",
        "stages.gateway.config.data_dir=/data",
        "stages.render.dials={audio,nope}",
        "stages.render.cache.size=1Gi",
        "store.jobStore.url=mysql://db/lipline",
        "store.blobStore.url=/data",
        "store.blobStore.s3.secret=x",
        "stages.render.autoscaling.cpu=0",
    ):
        stderr = render_fails(bad)
        assert "values don't meet the specifications of the schema" in stderr, (bad, stderr)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            (*PG_SECRET, "store.jobStore.url=postgresql://a@b/c"),
            "existingSecret (a Secret with the PostgreSQL DSN) or url, not both",
        ),
        ((*S3, *RWX), "not both"),
        (("store.blobStore.s3.existingSecret=lipline-s3",), "store.blobStore.url is empty"),
        (
            ("store.local.enabled=false", *PG_SECRET),
            "store.blobStore.url (s3://...) or store.blobStore.persistence.existingClaim",
        ),
        (("store.local.enabled=false", *S3), "store.jobStore.existingSecret (a Secret with a PostgreSQL DSN)"),
    ],
)
def test_contradictory_or_missing_stores_fail_with_a_clear_message(sets: tuple[str, ...], message: str) -> None:
    assert message in render_fails(*sets)


def test_a_queue_target_left_at_the_gpu_ratio_fails_with_a_clear_message() -> None:
    # metric=queue's target is seconds: the default 0.8 (a GPU ratio) would never be reached
    message = render_fails("stages.lipsync.autoscaling.metric=queue")
    assert "stages.lipsync.autoscaling.target is 0.8 with metric queue, which is seconds" in message
    assert "e.g. 0.02" in message


def test_gpu_stages_request_gpus_and_land_on_gpu_nodes(default_docs: list[dict[str, Any]]) -> None:
    deployments = by_kind(default_docs, "Deployment")
    assert set(deployments) == {f"lip-lipline-{s}" for s in STAGES}
    for stage in STAGES:
        d = deployments[f"lip-lipline-{stage}"]
        limits = container(d)["resources"].get("limits", {})
        tolerations = d["spec"]["template"]["spec"].get("tolerations", [])
        if stage in GPU_STAGES:
            assert limits["nvidia.com/gpu"] == 1
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
            assert env_of(d)["LIPLINE_DEVICE"] == "cuda"
            assert d["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
        else:
            assert "nvidia.com/gpu" not in limits and not tolerations
            assert "LIPLINE_DEVICE" not in env_of(d) and "compile-cache" not in volumes_of(d)


def test_pods_run_non_root_read_only_with_native_grpc_probes(rendered: list[dict[str, Any]]) -> None:
    for name, d in by_kind(rendered, "Deployment").items():
        pod = d["spec"]["template"]["spec"]
        c = container(d)
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, name
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], name
        assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"]), f"{name}: no writable /tmp"
        grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"]["port"] == grpc_port, (name, probe)
        # The service drains for grace_s after SIGTERM; Kubernetes must wait at least that long.
        assert pod["terminationGracePeriodSeconds"] > int(env_of(d)["LIPLINE_GRACE_S"])


def test_callers_dial_exactly_their_stages_through_headless_services(rendered: list[dict[str, Any]]) -> None:
    services = by_kind(rendered, "Service")
    deployments = by_kind(rendered, "Deployment")
    dialled = {"gateway": ("audio", "lipsync"), "render": ("lipsync", "superres"), "live": ("lipsync", "superres")}
    for caller, targets in dialled.items():
        env = env_of(deployments[f"lip-lipline-{caller}"])
        addresses = {k for k in env if k.endswith("_ADDRESS")} - {
            "LIPLINE_ADVERTISE_ADDRESS"
        }  # its own, not one it dials
        assert addresses == {f"LIPLINE_{t.upper()}_ADDRESS" for t in targets}, caller
        for stage in targets:
            svc = services[f"lip-lipline-{stage}"]
            assert svc["spec"]["clusterIP"] == "None"  # one address per pod: client-side round-robin
            port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc")
            assert env[f"LIPLINE_{stage.upper()}_ADDRESS"] == f"dns:///lip-lipline-{stage}.media.svc:{port}"
    # The gateway no longer talks to superres; nothing talks to a render worker; the gateway finds the
    # live workers in the job store, not at an address of the chart's.
    assert not {"LIPLINE_SUPERRES_ADDRESS", "LIPLINE_LIVE_ADDRESS"} & set(env_of(deployments["lip-lipline-gateway"]))


def test_gateway_is_stateless_two_replicas_a_pdb_and_no_affinity(pg_rwx_docs: list[dict[str, Any]]) -> None:
    gateway = by_kind(pg_rwx_docs, "Deployment")["lip-lipline-gateway"]
    assert gateway["spec"]["replicas"] == 2
    assert by_kind(pg_rwx_docs, "PodDisruptionBudget")["lip-lipline-gateway"]["spec"]["minAvailable"] == 1
    assert "affinity" not in gateway["spec"]["template"]["spec"]
    # No local data or output volumes any more: jobs and blobs live in the stores.
    # (and the read-only auth Secrets, tests/helm/test_chart_auth.py)
    assert set(volumes_of(gateway)) == {"tmp", "blobs", "api-keys", "internal-token"}
    assert not {"LIPLINE_DATA_DIR", "LIPLINE_OUTPUT_DIR"} & set(env_of(gateway))


def test_no_session_affinity_on_the_gateway_service(rendered: list[dict[str, Any]]) -> None:
    """Any gateway replica answers any request (the job store is shared): clients are not pinned."""
    svc = by_kind(rendered, "Service")["lip-lipline-gateway"]
    assert "clusterIP" not in svc["spec"] and svc["spec"]["type"] in {"ClusterIP", "LoadBalancer"}
    assert svc["spec"].get("sessionAffinity", "None") == "None"


def test_render_workers_run_on_the_cpu_with_the_stores_a_cache_and_probes(pg_rwx_docs: list[dict[str, Any]]) -> None:
    render_d = by_kind(pg_rwx_docs, "Deployment")["lip-lipline-render"]
    c = container(render_d)
    env = env_of(render_d)
    assert c["args"] == ["python", "-m", "services.render"]
    assert render_d["spec"]["replicas"] == 2  # autoscaling off in this variant
    assert c["resources"]["requests"] == {"cpu": "2", "memory": "2Gi"}
    assert env["LIPLINE_PORT"] == "50064" and env["LIPLINE_METRICS_PORT"] == "9095"
    assert c["startupProbe"]["grpc"]["port"] == 50064
    # The stores: the DSN from the Secret, the blob folder on the ReadWriteMany claim.
    assert env["LIPLINE_JOB_STORE"] == "secret:lipline-pg/dsn"
    assert env["LIPLINE_BLOB_STORE"] == "/var/lib/lipline-blobs" == mounts_of(render_d)["blobs"]
    assert volumes_of(render_d)["blobs"]["persistentVolumeClaim"] == {"claimName": "lipline-blobs"}
    # The local cache is scratch: an emptyDir, passed as LIPLINE_CACHE_DIR.
    assert "emptyDir" in volumes_of(render_d)["cache"] and mounts_of(render_d)["cache"] == env["LIPLINE_CACHE_DIR"]
    # The gateway reads the same stores.
    gateway_env = env_of(by_kind(pg_rwx_docs, "Deployment")["lip-lipline-gateway"])
    assert {k: gateway_env[k] for k in ("LIPLINE_JOB_STORE", "LIPLINE_BLOB_STORE")} == {
        k: env[k] for k in ("LIPLINE_JOB_STORE", "LIPLINE_BLOB_STORE")
    }
    # No try-out volume with shared stores, and no stage without `stores` sees them.
    assert "PersistentVolumeClaim" not in {d["kind"] for d in pg_rwx_docs}
    for name, d in by_kind(pg_rwx_docs, "Deployment").items():
        if not name.endswith(STORE_STAGES):
            assert "LIPLINE_JOB_STORE" not in env_of(d), name


def test_s3_blob_store_takes_its_credentials_from_a_secret(s3_docs: list[dict[str, Any]]) -> None:
    for stage in STORE_STAGES:
        d = by_kind(s3_docs, "Deployment")[f"lip-lipline-{stage}"]
        env = env_of(d)
        assert env["LIPLINE_BLOB_STORE"] == "s3://lipline-media/prod"
        assert env["AWS_ACCESS_KEY_ID"] == "secret:lipline-s3/AWS_ACCESS_KEY_ID"
        assert env["AWS_SECRET_ACCESS_KEY"] == "secret:lipline-s3/AWS_SECRET_ACCESS_KEY"
        assert env["AWS_ENDPOINT_URL"] == "https://minio.storage.svc:9000" and env["AWS_REGION"] == "eu-west-1"
        # The dev DSN goes through a Secret of the chart's, never into the pod spec; a change rolls the pods.
        assert env["LIPLINE_JOB_STORE"] == "secret:lip-lipline-store/job-store-url"
        assert "checksum/store" in d["spec"]["template"]["metadata"]["annotations"]
        assert set(volumes_of(d)) <= {"tmp", "cache", "api-keys", "internal-token"}  # no blob volume
    secret = by_kind(s3_docs, "Secret")["lip-lipline-store"]
    assert secret["stringData"]["job-store-url"].startswith("postgresql://")


def test_default_install_is_a_working_single_node_try_out(default_docs: list[dict[str, Any]]) -> None:
    """No shared stores configured: SQLite and the blob folder on one RWO volume, every pod using it on one node."""
    (pvc,) = by_kind(default_docs, "PersistentVolumeClaim").values()
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    for stage in STORE_STAGES:
        d = by_kind(default_docs, "Deployment")[f"lip-lipline-{stage}"]
        env = env_of(d)
        assert env["LIPLINE_JOB_STORE"] == SQLITE
        assert env["LIPLINE_BLOB_STORE"] == "/var/lib/lipline/blobs"
        assert volumes_of(d)["local-store"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
        assert mounts_of(d)["local-store"] == "/var/lib/lipline"
        pod = d["spec"]["template"]
        (term,) = pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    # Replicas stay as in production; PDBs would block a drain of the one node, so those pods have none.
    assert by_kind(default_docs, "Deployment")["lip-lipline-gateway"]["spec"]["replicas"] == 2
    assert set(by_kind(default_docs, "PodDisruptionBudget")) == {"lip-lipline-audio"}


def test_every_lipline_variable_is_a_real_setting_of_its_service(rendered: list[dict[str, Any]]) -> None:
    classes = _settings_classes()
    assert set(classes) == set(STAGE_REGISTRY)
    for stage, cls in classes.items():
        if stage not in STAGES:  # not deployed by these values (test_chart_musetalk.py checks it enabled)
            continue
        fields = {f"LIPLINE_{f.name.upper()}" for f in dataclasses.fields(cls)}
        d = by_kind(rendered, "Deployment")[f"lip-lipline-{stage}"]
        unknown = {k for k in env_of(d) if k.startswith("LIPLINE_")} - fields
        assert not unknown, f"{stage}: the chart sets {sorted(unknown)}, which the service does not read"


def _settings_classes() -> dict[str, type]:
    return _gen_chart_schema().settings_classes()


def test_the_chart_settings_parse_as_the_services_would(default_docs: list[dict[str, Any]]) -> None:
    from services.serving.settings import parse_settings

    for stage, cls in _settings_classes().items():
        if stage not in STAGES:
            continue
        env = env_of(by_kind(default_docs, "Deployment")[f"lip-lipline-{stage}"])
        settings = parse_settings(cls, [], environ=env)
        settings.validate()
        assert settings.port == int(env["LIPLINE_PORT"])
        if stage in STORE_STAGES:
            assert settings.job_store == SQLITE


def test_checkpoints_are_only_configured_with_a_models_volume() -> None:
    without = by_kind(render(), "Deployment")
    assert "LIPLINE_CHECKPOINT" not in env_of(without["lip-lipline-lipsync"])
    with_models = by_kind(render("models.existingClaim=weights"), "Deployment")
    assert env_of(with_models["lip-lipline-lipsync"])["LIPLINE_CHECKPOINT"] == "/models/wav2lip.pth"
    mounts = container(with_models["lip-lipline-superres"])["volumeMounts"]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in mounts
    assert "models" not in volumes_of(with_models["lip-lipline-render"])
    moved = by_kind(render("models.existingClaim=weights", "models.mountPath=/weights/"), "Deployment")
    assert env_of(moved["lip-lipline-superres"])["LIPLINE_CHECKPOINT"] == "/weights/realesr-general-x4v3.pth"


def _adapter_rules() -> dict[str, Any]:
    return yaml.safe_load((CHART / "files" / "adapter-rules.yaml").read_text())


def test_hpas_scale_on_the_adapters_metrics(rendered: list[dict[str, Any]]) -> None:
    hpas = by_kind(rendered, "HorizontalPodAutoscaler")
    deployments = by_kind(rendered, "Deployment")
    adapter = _adapter_rules()
    served = {rule["name"]["as"] for rule in adapter["rules"]}
    served_external = {rule["name"]["as"] for rule in adapter["externalRules"]}
    for name, hpa in hpas.items():
        target = hpa["spec"]["scaleTargetRef"]["name"]
        assert target in deployments and "replicas" not in deployments[target]["spec"], name
        for metric in hpa["spec"]["metrics"]:
            if metric["type"] == "Pods":
                assert metric["pods"]["metric"]["name"] in served, name
            if metric["type"] == "External":
                assert metric["external"]["metric"]["name"] in served_external, name
        assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300


def test_render_workers_scale_on_segments_waiting_per_worker_and_cpu(default_docs: list[dict[str, Any]]) -> None:
    hpa = by_kind(default_docs, "HorizontalPodAutoscaler")["lip-lipline-render"]
    external, cpu = hpa["spec"]["metrics"]
    assert external["type"] == "External"
    # AverageValue: the HPA divides the queue (one value for the whole queue) by the number of workers.
    assert external["external"]["target"] == {"type": "AverageValue", "averageValue": "2000m"}
    assert external["external"]["metric"]["selector"]["matchLabels"] == {"service": "lip-lipline-render"}
    assert cpu == {
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
    }
    assert hpa["spec"]["minReplicas"] == 2
    # The adapter's rule: the one shared queue, so max() of what the workers report, segments only.
    (rule,) = [
        r for r in _adapter_rules()["externalRules"] if r["name"]["as"] == external["external"]["metric"]["name"]
    ]
    assert rule["seriesQuery"].startswith("lipline_queue_depth{")
    assert rule["metricsQuery"].startswith("max(") and 'kind="segment"' in rule["metricsQuery"]
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}


def _replica_floor(docs: list[dict[str, Any]], name: str) -> int:
    """The fewest replicas a stage runs: its HPA's or ScaledObject's minimum, else its fixed count."""
    if name in (hpas := by_kind(docs, "HorizontalPodAutoscaler")):
        return hpas[name]["spec"]["minReplicas"]
    if name in (scaled := by_kind(docs, "ScaledObject")):
        return scaled[name]["spec"]["minReplicaCount"]
    return by_kind(docs, "Deployment")[name]["spec"]["replicas"]


def test_gpu_stages_autoscale_on_a_pods_metric_by_default(default_docs: list[dict[str, Any]]) -> None:
    hpas = by_kind(default_docs, "HorizontalPodAutoscaler")
    for stage in GPU_STAGES:
        (metric,) = hpas[f"lip-lipline-{stage}"]["spec"]["metrics"]
        assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == "lipline_gpu_utilization_ratio"


def test_pdbs_never_pin_a_single_replica(rendered: list[dict[str, Any]]) -> None:
    for name, pdb in by_kind(rendered, "PodDisruptionBudget").items():
        assert _replica_floor(rendered, name) > pdb["spec"]["minAvailable"], name


def test_keda_replaces_the_hpas_of_the_queue_and_gpu_stages() -> None:
    docs = render(*VARIANTS["KEDA, PostgreSQL"])
    scaled = by_kind(docs, "ScaledObject")
    hpas = by_kind(docs, "HorizontalPodAutoscaler")
    assert set(scaled) == {"lip-lipline-lipsync", "lip-lipline-superres", "lip-lipline-render", "lip-lipline-live"}
    assert set(hpas) == {"lip-lipline-audio"}  # CPU-scaled: a plain HPA, KEDA not needed
    deployments = by_kind(docs, "Deployment")
    for name, obj in scaled.items():
        assert obj["spec"]["scaleTargetRef"]["name"] in deployments and "replicas" not in deployments[name]["spec"]
        if name.endswith(("render", "live")):
            continue  # below, and tests/helm/test_chart_live.py
        (trigger,) = obj["spec"]["triggers"]
        assert trigger["type"] == "prometheus" and float(trigger["metadata"]["threshold"]) > 0
        assert (
            f'pod=~"{name}-.*"' in trigger["metadata"]["query"] and 'namespace="media"' in trigger["metadata"]["query"]
        )
    assert (
        "lipline_stage_queue_seconds_sum" in scaled["lip-lipline-superres"]["spec"]["triggers"][0]["metadata"]["query"]
    )
    assert "PodDisruptionBudget" in {d["kind"] for d in docs}  # lipsync keeps 2 replicas: it gets a PDB


def test_keda_scales_render_workers_with_the_postgresql_scaler_on_the_job_stores_secret() -> None:
    docs = render(*VARIANTS["KEDA, PostgreSQL"])
    obj = by_kind(docs, "ScaledObject")["lip-lipline-render"]
    queue, cpu = obj["spec"]["triggers"]
    assert queue["type"] == "postgresql" and queue["metricType"] == "AverageValue"
    assert queue["metadata"]["query"] == "SELECT count(*) FROM tasks WHERE state = 'waiting'"
    assert float(queue["metadata"]["targetQueryValue"]) == 2
    assert cpu == {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "80"}}
    auth = by_kind(docs, "TriggerAuthentication")[queue["authenticationRef"]["name"]]
    (ref,) = auth["spec"]["secretTargetRef"]
    assert ref["parameter"] == "connection"
    # The very Secret and key the workers read their DSN from.
    env = env_of(by_kind(docs, "Deployment")["lip-lipline-render"])
    assert env["LIPLINE_JOB_STORE"] == f"secret:{ref['name']}/{ref['key']}" == "secret:lipline-pg/dsn"
    assert (
        obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
        >= 300
    )


def test_keda_without_postgresql_scales_render_workers_on_the_prometheus_queue_metric() -> None:
    docs = render(*VARIANTS["KEDA, SQLite"])
    obj = by_kind(docs, "ScaledObject")["lip-lipline-render"]
    queue, cpu = obj["spec"]["triggers"]
    assert queue["type"] == "prometheus" and queue["metricType"] == "AverageValue"
    assert (
        queue["metadata"]["query"]
        == 'max(lipline_queue_depth{kind="segment",namespace="media",pod=~"lip-lipline-render-.*"})'
    )
    assert cpu["type"] == "cpu"
    assert "TriggerAuthentication" not in {d["kind"] for d in docs}


def _grpc_callers(policy: dict[str, Any]) -> set[str] | None:
    """The components a policy admits to the gRPC port; None = everyone; empty = nobody."""
    rules = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "grpc"]
    if not rules:
        return set()
    (rule,) = rules
    if "from" not in rule:
        return None
    return {
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for peer in rule["from"]
        if "podSelector" in peer
    }


def test_stages_accept_grpc_only_from_their_callers(default_docs: list[dict[str, Any]]) -> None:
    policies = by_kind(default_docs, "NetworkPolicy")
    assert set(policies) == {f"lip-lipline-{s}" for s in STAGES}
    for stage, callers in CALLERS.items():
        policy = policies[f"lip-lipline-{stage}"]
        assert _grpc_callers(policy) == callers, stage
        for rule in policy["spec"]["ingress"]:
            for peer in rule.get("from", []):
                if "podSelector" in peer:
                    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "lip"
    assert _grpc_callers(policies["lip-lipline-gateway"]) is None  # gatewayFrom empty: the API is open


def test_the_public_api_admits_gateway_from_and_the_helm_test_pod() -> None:
    docs = render(*VARIANTS["queue-time autoscaling, gateway LoadBalancer, gatewayFrom"])
    policy = by_kind(docs, "NetworkPolicy")["lip-lipline-gateway"]
    (rule,) = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "grpc"]
    assert {"namespaceSelector": {"matchLabels": {"team": "product"}}} in rule["from"]
    assert _grpc_callers(policy) == {"test", "web"}  # the web page's pods dial it (its `dials`)


def test_servicemonitor_scrapes_every_stage_metrics_port(default_docs: list[dict[str, Any]]) -> None:
    (monitor,) = by_kind(default_docs, "ServiceMonitor").values()
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["endpoints"]
    matched = {
        s["metadata"]["name"]: s
        for s in by_kind(default_docs, "Service").values()
        if selector.items() <= s["metadata"]["labels"].items()
    }
    assert set(matched) == {f"lip-lipline-{s}" for s in STAGES}  # render workers included
    for svc in matched.values():
        assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert next(p["port"] for p in matched["lip-lipline-render"]["spec"]["ports"] if p["name"] == "metrics") == 9095


def test_stage_templates_range_over_the_stage_list() -> None:
    """STYLE.md: one list in values, templates range over it; traits are values, not names in templates."""
    names = "|".join(STAGES)
    for template in ("deployments.yaml", "services.yaml", "autoscaling.yaml", "pdb.yaml", "networkpolicy.yaml"):
        text = (CHART / "templates" / template).read_text()
        code = "\n".join(re.findall(r"\{\{.*?\}\}", text, re.S))
        assert "range $stage, $s := $root.Values.stages" in text, template
        assert not re.search(rf'"({names})"', code), f"{template} names a stage"


def _rule_expressions() -> Iterator[str]:
    rules = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            yield rule["expr"]


def _dashboard(docs: list[dict[str, Any]]) -> str:
    dashboards = [d for d in by_kind(docs, "ConfigMap").values() if "lipline-overview.json" in d.get("data", {})]
    return dashboards[0]["data"]["lipline-overview.json"]


def test_alerts_and_dashboards_use_metrics_the_services_export(default_docs: list[dict[str, Any]]) -> None:
    from services.serving.metrics import Metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    exported = {
        family.name + suffix
        for family in Metrics("any").registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }
    # GpuCollector's families exist only where NVML sees a GPU.
    exported |= {
        "lipline_gpu_utilization_ratio",
        "lipline_gpu_memory_used_bytes",
        "lipline_gpu_memory_total_bytes",
        "lipline_gpu_power_watts",
    }
    (rule,) = by_kind(default_docs, "PrometheusRule").values()
    assert rule["spec"]["groups"]
    texts = [*_rule_expressions(), _dashboard(default_docs)]
    texts += [r["seriesQuery"] for r in _adapter_rules()["externalRules"]]
    used = {m for text in texts for m in re.findall(r"\blipline_[a-z_]+", text)}
    missing = sorted(m for m in used if m not in exported)
    assert not missing, f"rules/dashboards query metrics nobody exports: {missing}"


def test_the_render_workers_are_on_the_dashboard_and_alerted_on(default_docs: list[dict[str, Any]]) -> None:
    import json

    exprs = " ".join(t["expr"] for p in json.loads(_dashboard(default_docs))["panels"] for t in p.get("targets", []))
    for metric in (
        "lipline_queue_depth",
        "lipline_queue_wait_seconds_bucket",
        "lipline_segments_total",
        "lipline_lease_lost_total",
        "lipline_render_frames_total",
        "lipline_render_composite_seconds_bucket",
        "lipline_render_encode_seconds_bucket",
    ):
        assert metric in exprs, metric
    assert "sum(lipline_queue_depth" not in exprs.replace(" ", "")  # one shared queue: max, never sum
    rules = {
        r.get("alert"): r
        for g in yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())["groups"]
        for r in g["rules"]
    }
    assert rules["LiplineRenderQueueWaitHigh"]["for"] == "10m" and "> 30" in rules["LiplineRenderQueueWaitHigh"]["expr"]
    assert (
        "lipline_lease_lost_total" in rules["LiplineRenderLeasesLost"]["expr"]
        and rules["LiplineRenderLeasesLost"]["for"] == "10m"
    )


def test_helm_test_hook_runs_the_smoke_check_against_the_gateway(default_docs: list[dict[str, Any]]) -> None:
    (pod,) = by_kind(default_docs, "Pod").values()
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    args = pod["spec"]["containers"][0]["args"]
    assert args[:3] == ["python", "-m", "services.gateway.smoke"]
    assert "--address=lip-lipline-gateway:50051" in args


def test_values_schema_is_generated_from_the_services_settings() -> None:
    assert (CHART / "values.schema.json").read_text() == _gen_chart_schema().render(), (
        "values.schema.json is stale: run `python scripts/gen_chart_schema.py`"
    )


def test_promtool_accepts_the_chart_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (Debian package 'prometheus'; bash scripts/install.sh installs it)")
    rules = CHART / "files" / "prometheus-rules.yaml"
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(group["rules"]) for group in yaml.safe_load(rules.read_text())["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout


def test_kubernetes_discovery_watches_endpoint_slices_with_the_least_rights() -> None:
    docs = render("discovery.kubernetes=true")
    assert validate_builtin(docs, "1.29.0") > 0
    (role,) = by_kind(docs, "Role").values()
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}
    ]
    (binding,) = by_kind(docs, "RoleBinding").values()
    account = by_kind(docs, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [s["name"] for s in binding["subjects"]] == list(account)
    deployments = by_kind(docs, "Deployment")
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        callers = name.endswith(("-gateway", "-render", "-live", "-web"))
        assert pod["automountServiceAccountToken"] is callers, name  # the API token only where it is used
    assert (
        env_of(deployments["lip-lipline-render"])["LIPLINE_LIPSYNC_ADDRESS"] == "k8s:///lip-lipline-lipsync.media:50062"
    )
    # Off by default: no Role, DNS addresses, no token in any pod.
    default = render()
    assert not by_kind(default, "Role")
    assert all(
        d["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
        for d in by_kind(default, "Deployment").values()
    )
