#!/usr/bin/env bash
# The GPU measurements of one lent-H200 session, in one command (device time is scarce):
#   the GPU unit tests, the lipsync service through gRPC with the default `auto` backend (two client
#   loads), then `--backend compile` cold (compiles, saves the cache) and again with a fresh Inductor
#   cache dir (what a new pod with the cache volume sees). Results: JSON + logs in $OUT.
# Needs the generated protos (`lipline/`) and the wheels in .whl/ (bench/README.md says which).
set -u
OUT=${OUT:-var/bench/gpu}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, grpc, google.protobuf as pb; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'grpcio', grpc.__version__, 'protobuf', pb.__version__)"
  nproc; date -u; } | tee "$OUT/env.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/unit/lipsync/test_engine.py tests/unit/common/test_backends.py 2>&1 | tail -4 | tee "$OUT/tests.txt"
grpc() {  # name, then extra flags
  local name=$1; shift
  timeout "${T:-120}" python3 bench/bench_lipsync_grpc.py --device cuda --max-batch 256 --items 64 --window 2 \
    --seconds 20 --warmup-seconds 5 --log-level INFO --keep-log "$OUT/$name.log" --out "$OUT/$name.json" "$@" 2>&1 \
    | grep -E '^\||SERVING|error|Error' | tail -4
}
grpc auto-s32-p4 --streams 32 --procs 4
grpc auto-s64-p8 --streams 64 --procs 8
grpc auto-depth2-s32-p4 --streams 32 --procs 4 --pipeline-depth 2
T=330 grpc compile-cold --backend compile --batch-buckets 256 --streams 64 --procs 8
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) T=150 grpc compile-warm --backend compile --batch-buckets 256 --streams 64 --procs 8
ls -la var/compile-cache 2>/dev/null | tee "$OUT/compile-cache.txt"
timeout 120 python3 bench/bench_superres_grpc.py --device cuda --max-batch 128 --streams 32 --procs 4 --seconds 20 \
  --warmup-seconds 5 --out "$OUT/superres-s32-p4.json" 2>&1 | grep -E '^\||error|Error' | tail -3
