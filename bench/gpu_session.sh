#!/usr/bin/env bash
# The GPU measurements of one lent-H200 session (device time is scarce), in two calls because the
# wheels the device lacks do not fit one 64 MiB carry (bench/README.md, "On the lent H200"):
#   bash bench/gpu_session.sh services   carry .whl   : installs .whl into .devsite, GPU unit tests,
#                                                     lipsync + superres services through gRPC
#   bash bench/gpu_session.sh e2e        carry .whlcv : adds OpenCV 4 (Haar) to .devsite, 60 s 720p e2e
# `e2e` reuses the .devsite of a `services` call on the same warm machine. Results: JSON + logs in $OUT.
# Extra arguments after the phase are passed on (`services`: run names to keep; `e2e`: bench_e2e flags).
set -u
phase=${1:-services}; shift || true
OUT=${OUT:-var/bench/gpu}
mkdir -p "$OUT" .devsite
for dir in .whl .whlcv; do
  if [ -d "$dir" ] && compgen -G "$dir/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .devsite "$dir"/*.whl || exit 1
  fi
done
export PYTHONPATH=$PWD/.devsite:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, grpc, cv2, google.protobuf as pb; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'grpcio', grpc.__version__, 'protobuf', pb.__version__, 'opencv', cv2.__version__)"
  nproc; date -u; } | tee "$OUT/env-$phase.txt"

wanted() { [ $# -eq 0 ] || [[ " $* " == *" $name "* ]]; }
lipsync() {  # name, then extra flags
  local name=$1; shift
  wanted "${KEEP[@]}" || return 0
  timeout "${T:-120}" python3 bench/bench_lipsync_grpc.py --device cuda --max-batch 256 --items 64 --window 2 \
    --seconds 20 --warmup-seconds 5 --log-level INFO --keep-log "$OUT/$name.log" --out "$OUT/$name.json" "$@" 2>&1 \
    | grep -E '^\||SERVING|rror' | tail -3
}
superres() {
  local name=$1; shift
  wanted "${KEEP[@]}" || return 0
  timeout "${T:-120}" python3 bench/bench_superres_grpc.py --device cuda --max-batch 128 --seconds 20 \
    --warmup-seconds 5 --out "$OUT/$name.json" "$@" 2>&1 | grep -E '^\||rror' | tail -3
}

case $phase in
services)
  KEEP=("$@")
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit/superres/test_engine.py tests/unit/lipsync/test_engine.py tests/unit/common/test_backends.py tests/unit/common/test_resize.py 2>&1 | tail -5 | tee "$OUT/tests.txt"
  name=lipsync-r1; lipsync lipsync-r1 --streams 64 --procs 8
  name=lipsync-depth2; lipsync lipsync-depth2 --streams 64 --procs 8 --pipeline-depth 2
  name=lipsync-r2-gpu0; lipsync lipsync-r2-gpu0 --streams 96 --procs 10 --replicas 2 --gpus 0,0
  name=lipsync-r3-gpu0; lipsync lipsync-r3-gpu0 --streams 96 --procs 10 --replicas 3 --gpus 0,0,0
  name=superres-r1; superres superres-r1 --streams 32 --procs 4
  name=superres-r2-gpu0; superres superres-r2-gpu0 --streams 64 --procs 8 --replicas 2 --gpus 0,0
  ;;
e2e)
  timeout 500 python3 bench/bench_e2e.py --device cuda --warmup-seconds 4 --log-level INFO \
    --workdir "$OUT/e2e-work" --out "$OUT/e2e-720p-60s.json" "$@" 2>&1 | grep -vE '^\s*$' | tail -45
  rm -f "$OUT"/e2e-work/*.mp4 "$OUT"/e2e-work/*.wav 2>/dev/null
  ;;
*) echo "usage: $0 services|e2e [...]" >&2; exit 2 ;;
esac
