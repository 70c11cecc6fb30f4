#!/usr/bin/env bash
# The GPU measurements of one lent-H200 session (device time is scarce), in two calls because the
# wheels the device lacks do not fit one 64 MiB carry (bench/README.md, "On the lent H200"):
#   bash bench/gpu_session.sh services   carry .whl   : installs .whl into .devsite, GPU unit tests,
#                                                     bare SRVGG rows, lipsync + superres through gRPC
#   bash bench/gpu_session.sh compile    (after services): --backend compile, cold then warm replicas
#   bash bench/gpu_session.sh e2e        carry .whlcv : adds OpenCV 4 (Haar) to .devsite, 60 s 720p e2e
#   bash bench/gpu_session.sh jobs       (after e2e)  : 16 concurrent 30 s jobs with 16, 8, 4, 2, 1 render workers
#   bash bench/gpu_session.sh verify     (after services): the GPU metric, --warm-cache-only, auto's compile fallback
#   bash bench/gpu_session.sh live-profile (as live; carry .prom with py-spy): one count, one live worker profiled
#   bash bench/gpu_session.sh autoscale  (after services and e2e; carry .prom): bench/autoscale.py, the chart's HPAs on
#                                        real replicas through a burst and back; METRIC=gpu|queue
#   bash bench/gpu_session.sh musetalk   carry .whl .cvx : the lipsync-musetalk stage (256 px tier) through gRPC on
#                                        seeded full-size networks: compiled exact, compiled --fast-decode and its mean
#                                        absolute difference to exact, a restart from the warm compile cache, eager fp16
#                                        (MT_RUNS="exact warm guard fast mad eager": which of them)
#   bash bench/gpu_session.sh musetalk-product (after musetalk, carry .whlav lipline): a 60 s 720p clip on the tier (SubmitJob
#                                        -> MP4), then COUNTS live 256-tier sessions (512x512, H.264); SKIP_E2E=1 live only
#   bash bench/gpu_session.sh live       (after services and e2e, or carry .whlcv): bench_live.py, N concurrent live
#                                        sessions through the gateway; SIZE=512x512|1280x720 PRESET=ultrafast|veryfast
#                                        CODECS=h264,jpeg|h264|jpeg (one call per size and preset: the preset is the workers')
#   bash bench/gpu_session.sh scaleout STEP (after services and e2e, or carry .whl then .cvx): issue 32's scale-out
#                                        table over the host's GPUs, N = 1,2,4,8 up to `nvidia-smi -L`, each N beside the
#                                        1-GPU run of the same call; STEP = lipsync | live | jobs, one call each (live on
#                                        8 GPUs: NS=2,4 then NS=8); NS=2,4 runs only those N (and 1); PIN=all pins workers
# `e2e` reuses the .devsite of a `services` call on the same warm machine. Results: JSON + logs in $OUT.
# Extra arguments after the phase are passed on (`services`: run names to keep; `e2e`: bench_e2e flags).
set -u
phase=${1:-services}; shift || true
OUT=${OUT:-var/bench/gpu}
mkdir -p "$OUT" .devsite
for dir in .whl .whlcv .whlav; do  # wheels the device lacks (bench/README.md, "On the lent H200")
  if [ -d "$dir" ] && compgen -G "$dir/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .devsite "$dir"/*.whl || exit 1
  fi
done
if [ -f .cvx/cv.tar.xz ] && [ ! -d .devsite/cv2 ]; then tar xJf .cvx/cv.tar.xz -C .devsite || exit 1; fi  # OpenCV 4
export PYTHONPATH=$PWD/.devsite:$PWD:$PWD/clients/python/src PYTHONUNBUFFERED=1  # lipline_client: the benches use it
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

gpus=$(nvidia-smi -L | wc -l)
CACHE=$PWD/var/compile-cache
case $phase in
services)  # the default backend (auto: fp16 + folded BN + CUDA graphs), batches overlapped (depth 2)
  KEEP=("$@")
  name=tests; if wanted "${KEEP[@]}"; then
    # (the device lacks psycopg, kubernetes and opentelemetry-sdk: those modules have no GPU tests)
    timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit --ignore=tests/unit/jobs/store \
      --ignore=tests/unit/serving/test_discovery.py --ignore=tests/unit/render/test_tracing.py 2>&1 | tail -25 | tee "$OUT/tests.txt"
  fi
  name=lipsync-d2-r1; lipsync $name --streams 64 --procs 8 --pipeline-depth 2
  name=lipsync-d2-r2-gpu00; lipsync $name --streams 96 --procs 12 --replicas 2 --gpus 0,0 --pipeline-depth 2
  if [ "$gpus" -ge 2 ]; then
    name=lipsync-d2-r2-gpu01; lipsync $name --streams 128 --procs 12 --replicas 2 --gpus 0,1 --pipeline-depth 2
    name=lipsync-d2-r4-gpu0011; lipsync $name --streams 192 --procs 16 --replicas 4 --gpus 0,0,1,1 --pipeline-depth 2
  fi
  name=models-srvgg; if wanted "${KEEP[@]}"; then  # the bare network, compile rows included (one compile)
    timeout 300 python3 bench/bench_models.py --device cuda --models srvgg --sr-batch 128 --compile --no-e2e \
      --cache-dir "$CACHE" --out "$OUT/$name.json" 2>&1 | grep -E '^\|' | tail -8
  fi
  name=superres-stages; if wanted "${KEEP[@]}"; then
    timeout 120 python3 bench/bench_superres_stages.py --device cuda --batch 128 --out "$OUT/$name.json" 2>&1 | tail -9
  fi
  name=superres-d2-r1; superres $name --streams 32 --procs 4 --pipeline-depth 2
  name=superres-d2-r2-gpu00; superres $name --streams 64 --procs 8 --replicas 2 --gpus 0,0 --pipeline-depth 2
  ;;
compile)  # --backend compile: a cold compile that fills $CACHE, then replicas that start from it
  KEEP=("$@")
  export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)  # a cold compile: nothing from earlier calls on this machine
  name=lipsync-compile-cold; T=400 lipsync $name --backend compile --batch-buckets 256 --compile-cache-dir "$CACHE" \
    --streams 64 --procs 8 --pipeline-depth 2
  export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)  # only our artifacts, not Inductor's local cache
  name=lipsync-compile-warm-r1; T=200 lipsync $name --backend compile --batch-buckets 256 --compile-cache-dir "$CACHE" \
    --streams 64 --procs 8 --pipeline-depth 2  # one pod starting alone from the warm cache
  name=lipsync-compile-warm-r2-gpu00; T=200 lipsync $name --backend compile --batch-buckets 256 --compile-cache-dir "$CACHE" \
    --streams 128 --procs 12 --replicas 2 --gpus 0,0 --pipeline-depth 2
  name=lipsync-compile-warm-r3-gpu000; T=200 lipsync $name --backend compile --batch-buckets 256 --compile-cache-dir "$CACHE" \
    --streams 144 --procs 12 --replicas 3 --gpus 0,0,0 --pipeline-depth 2
  export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)
  name=superres-compile-cold; T=400 superres $name --backend compile --batch-buckets 128 --compile-cache-dir "$CACHE" \
    --streams 32 --procs 4 --pipeline-depth 2
  export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)
  name=superres-compile-warm-r2-gpu00; T=200 superres $name --backend compile --batch-buckets 128 --compile-cache-dir "$CACHE" \
    --streams 64 --procs 8 --replicas 2 --gpus 0,0 --pipeline-depth 2
  name=superres-compile-warm-r3-gpu000; T=200 superres $name --backend compile --batch-buckets 128 --compile-cache-dir "$CACHE" \
    --streams 96 --procs 12 --replicas 3 --gpus 0,0,0 --pipeline-depth 2
  name=superres-auto-warm-r2-gpu00; T=200 superres $name --backend auto --batch-buckets 128 --compile-cache-dir "$CACHE" \
    --streams 64 --procs 8 --replicas 2 --gpus 0,0 --pipeline-depth 2  # auto finds the warm cache: compile
  ls -la "$CACHE" | tee "$OUT/compile-cache.txt"
  ;;
aac)  # the AAC encoder alone (a job's audio task): 60 s of mono 48 kHz
  python3 - <<'PY' 2>&1 | tee "$OUT/aac.txt"
import os, tempfile, time
from pathlib import Path
import numpy as np
from services.media.decode import MUX_AUDIO_RATE, encode_aac
pcm = (np.random.default_rng(0).standard_normal(60 * MUX_AUDIO_RATE) * 0.1).astype(np.float32)
for _ in range(3):
    t = time.perf_counter(); encode_aac(pcm, MUX_AUDIO_RATE, Path(tempfile.mkdtemp()) / "a.m4a")
    print(f"encode_aac 60 s: {time.perf_counter() - t:.3f} s")
print("cpus", os.cpu_count(), "load", open("/proc/loadavg").read().strip())
PY
  ;;
e2e)  # needs OpenCV 4 (Haar) for CreateAvatar: carry .whlcv; reuses .whl from a `services` call
  # One 60 s 720p clip with SR (render workers: one per core), SubmitJob -> MP4.
  # The warm-up job (64 s = 32 segments) gives every worker its copy of the avatar, as in production.
  timeout 250 python3 bench/bench_e2e.py --device cuda --warmup-seconds 64 --log-level INFO \
    --workdir "$OUT/e2e-work" --out "$OUT/e2e-720p-60s.json" "$@" 2>&1 | grep -vE '^\s*$' | tail -40
  rm -rf "$OUT"/e2e-work
  ;;
jobs)  # 16 concurrent 30 s 720p jobs with SR, with 16, 8, 4, 2 and 1 render workers (after `e2e`)
  timeout 560 python3 bench/bench_e2e.py --device cuda --audio-seconds 30 --jobs 16 --warmup-seconds 64 \
    --worker-counts ${COUNTS:-32,16,8,4,2,1} --out "$OUT/e2e-jobs.json" "$@" 2>&1 | grep -E 'jobs|workers|SubmitJob|rror|Trace' | tail -30
  ;;
verify)  # issue 9 on a GPU (bench/gpu_verify.py): NVML metric, the compile-cache Job's mode, auto's fallback
  timeout 560 python3 bench/gpu_verify.py --out "$OUT/verify.json" 2>&1 | grep -E '^\[|rror|Trace' | tail -20
  ;;
live|live-profile)  # issue 19's table: N concurrent live sessions (bench/bench_live.py); needs OpenCV 4 (Haar) for CreateAvatar
  # 16 cores: the live workers composite and encode (the CPU that limits a host), the gateways relay every
  # message, the client processes send 50 chunks and read 25 frames a second per session. Defaults: 8 / 3 / 4.
  size=${SIZE:-512x512}; preset=${PRESET:-ultrafast}; codecs=${CODECS:-h264,jpeg}
  if [ "$size" = 1280x720 ]; then counts=${COUNTS:-25,50,75,100,150}; else counts=${COUNTS:-50,100,150,200,250,300}; fi
  name=live-$size-$preset-${codecs//,/-}
  if [ "$phase" = live-profile ]; then
    # One count (COUNTS, default 125) with one live worker under py-spy (carry .prom/py-spy, from `pip download
    # py-spy`'s wheel) and its threads' CPU (top -H), inside the measured window; summarise it here with
    # `python bench/pyspy_summary.py live-profile-raw.txt`. py-spy slows the worker it samples a little.
    counts=${COUNTS:-125}; codecs=${CODECS:-h264}; LIVE_SECONDS=${LIVE_SECONDS:-40}
    name=live-$size-$preset-${codecs//,/-}-profiled
    ( sleep "${PROFILE_AFTER_S:-45}"  # start-up (~21 s), the sessions created, 8 s of warm-up
      pid=$(pgrep -f "services.live " | head -1)
      top -H -b -n 2 -d 5 -p "$pid" | grep -A25 "^top" | tail -26 > "$OUT/live-profile-threads.txt"
      .prom/py-spy record -p "$pid" -d 10 -r 200 --threads -f raw -o "$OUT/live-profile-raw.txt" --nonblocking ) &
  fi
  timeout 570 python3 bench/bench_live.py --device cuda --size "$size" --preset "$preset" --codec "$codecs" \
    --session-counts "$counts" --seconds "${LIVE_SECONDS:-15}" --warmup-seconds 8 --live-workers "${LIVE_WORKERS:-8}" \
    --gateways "${GATEWAYS:-3}" --procs "${PROCS:-4}" --log-level INFO --workdir "$OUT/$name-work" --out "$OUT/$name.json" "$@" 2>&1 \
    | grep -vE '^\s*$' | tail -30 | tee "$OUT/$name.txt"
  # the services' logs of the run (the last 2000 lines each), not the template
  for log in "$OUT/$name-work"/cluster/*.log; do [ -f "$log" ] && tail -2000 "$log" > "$OUT/$name-$(basename "$log")"; done
  rm -rf "$OUT/$name-work"
  wait  # the profiler, if any
  ;;
autoscale)  # issue 22: the chart's HPAs driving real replicas (bench/autoscale.py); needs OpenCV 4 (Haar) for CreateAvatar.
  # No helm and no prometheus on the host: carry .prom/ with prometheus.xz (Debian's static binary, xz -9) and the
  # chart rendered here: `python bench/autoscale.py --render-only .prom/chart-gpu.json` (the GPU metric) and
  # `... --set stages.lipsync.autoscaling.metric=queue --set-json stages.lipsync.autoscaling.target=0.02 (and superres)
  # --render-only .prom/chart-queue.json`. METRIC=gpu|queue picks one; TIME_SCALE (5) divides windows and periods.
  [ -x .devsite/prometheus ] || xz -dc .prom/prometheus.xz > .devsite/prometheus && chmod +x .devsite/prometheus
  metric=${METRIC:-gpu}; name=autoscale-$metric
  timeout 590 python3 bench/autoscale.py --device cuda --prometheus .devsite/prometheus \
    --rendered ".prom/chart-$metric.json" --time-scale "${TIME_SCALE:-5}" --scale render,live,lipsync,superres \
    --super-resolution --burst-jobs "${JOBS:-32}" --sessions "${SESSIONS:-48}" --plateau-s "${PLATEAU_S:-120}" \
    --plateau-jobs-per-s 1 --max-idle-s 300 --log-level INFO --workdir "$OUT/$name-work" --out "$OUT/$name.json" "$@" 2>&1 \
    | grep -vE '^\s*$' | tail -60 | tee "$OUT/$name.txt"
  for log in "$OUT/$name-work"/cluster/*.log; do [ -f "$log" ] && tail -500 "$log" > "$OUT/$name-$(basename "$log")"; done
  rm -rf "$OUT/$name-work"
  ;;
scaleout)  # issue 32: the scale-out table on the host's GPUs (bench/README.md, "Scale-out"); extra arguments go to the bench
  # One replica of each GPU stage per GPU (--gpus 0..N-1); the CPU processes scale with the host's cores, not with N.
  step=${1:-lipsync}; shift || true
  cores=$(nproc)
  if [ -f .cvx/cv.tar.xz ] && [ ! -d .devsite/cv2 ]; then tar xJf .cvx/cv.tar.xz -C .devsite || exit 1; fi  # OpenCV 4 (Haar)
  ns=1; for n in $(echo "${NS:-2,4,8}" | tr ',' ' '); do [ "$n" -gt 1 ] && [ "$n" -le "$gpus" ] && ns="$ns $n"; done
  reserve=0; [ "$step" = jobs ] && reserve=100  # x264 alone first
  runs=$(echo $ns | wc -w); budget=$(( (${BUDGET_S:-550} - reserve) / runs ))  # each run's share of the call (10 min at most)
  pack=scaleout-$step-n${ns// /-}
  pin=(); [ -n "${PIN:-}" ] && pin=(--pin-cores "$PIN")
  echo "scaleout $step: N = $ns of $gpus GPUs, $cores cores, ${budget} s per run${PIN:+, workers pinned to $PIN}" | tee "$OUT/scaleout-$step.txt"
  case $step in
  lipsync)  # Wav2Lip frames/s through gRPC: 64 streams and up to 8 client processes per GPU (half the cores at most)
    for n in $ns; do
      procs=$(( 8 * n < cores / 2 ? 8 * n : cores / 2 )); [ "$procs" -ge 1 ] || procs=1
      KEEP=(); T=$budget lipsync scaleout-lipsync-g$n --gpus "$(seq -s, 0 $((n - 1)))" --streams $((64 * n)) \
        --procs "$procs" --pipeline-depth 2 "$@" | tee -a "$OUT/scaleout-$step.txt"
    done ;;
  live)  # 512x512 H.264 ultrafast sessions; 16 cores held ~100: counts around 6 per core, workers as on 16 cores
    base=$(( cores * 25 / 4 )); half=$(( cores > 1 ? cores / 2 : 1 )); quarter=$(( cores > 3 ? cores / 4 : 1 ))
    counts=${COUNTS:-$((base / 2)),$((base * 3 / 4)),$base,$((base * 5 / 4))}
    for n in $ns; do
      name=scaleout-live-g$n
      timeout -k 30 "$budget" python3 bench/bench_live.py --device cuda --size 512x512 --preset ultrafast --codec h264 \
        --gpus "$(seq -s, 0 $((n - 1)))" "${pin[@]}" --session-counts "$counts" --seconds "${LIVE_SECONDS:-12}" \
        --warmup-seconds 6 --live-workers "${LIVE_WORKERS:-$half}" --gateways "${GATEWAYS:-$(((cores + 4) / 5))}" \
        --procs "${PROCS:-$quarter}" --log-level INFO --workdir "$OUT/$name-work" --out "$OUT/$name.json" "$@" 2>&1 \
        | grep -vE '^\s*$' | tail -12 | tee -a "$OUT/scaleout-$step.txt"
      for log in "$OUT/$name-work"/cluster/{gateway,lipsync}*.log; do [ -f "$log" ] && tail -300 "$log" > "$OUT/$name-$(basename "$log")"; done
      rm -rf "$OUT/$name-work"
    done ;;
  jobs)  # 30 s 720p jobs with SR (one render worker per core), and x264 alone on the same cores (one writer per core)
    jobs=${JOBS:-$(( cores > 16 ? cores : 16 ))}
    if [ -n "${PIN:-}" ] && [ "$PIN" != all ]; then on=(taskset -c "$PIN"); writers=$(taskset -c "$PIN" nproc); else on=(); writers=$cores; fi
    timeout 90 "${on[@]}" python3 bench/bench_encode.py --frames 250 --presets veryfast --parallel "$writers" \
      --out "$OUT/scaleout-x264.json" 2>&1 | tail -3 | tee -a "$OUT/scaleout-$step.txt"
    for n in $ns; do
      timeout -k 30 "$budget" python3 bench/bench_e2e.py --device cuda --audio-seconds 30 --jobs "$jobs" \
        --warmup-seconds $(( 2 * cores > 64 ? 2 * cores : 64 )) \
        --gpus "$(seq -s, 0 $((n - 1)))" "${pin[@]}" --log-level WARNING --out "$OUT/scaleout-jobs-g$n.json" "$@" 2>&1 \
        | grep -E 'jobs|workers|CPU seconds|rror|Trace' | tail -8 | tee -a "$OUT/scaleout-$step.txt"
    done ;;
  *) echo "usage: $0 scaleout lipsync|live|jobs [bench flags]" >&2; exit 2 ;;
  esac
  python3 bench/scaleout_summary.py "$OUT" --out "$OUT/scaleout-summary-$step.json" | tee "$OUT/scaleout-summary-$step.txt"
  ;;

musetalk)  # issue 30: the 256 px tier's stage through gRPC, in one call (< 9 min); carry .whl (diffusers) and .cvx
  # Seeded full-size networks in the public layout (written once: 3.4 GB of fp32 UNet), compiled with Inductor's
  # default mode at BUCKETS (each bucket is a compile of UNet + VAE: keep them few), STREAMS streams of ITEMS items.
  python3 -c "import diffusers, cv2" 2>&1 | tail -1 | tee "$OUT/musetalk-imports.txt"
  models=$PWD/var/musetalk-seeded; cache=$PWD/var/compile-cache-musetalk
  export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)  # a cold compile: nothing from earlier calls on this machine
  [ -f "$models/musetalkV15/unet.pth" ] || python3 -c "from services.lipsync.musetalk.seeded import write_seeded_networks as w; import sys; w(sys.argv[1])" "$models" || exit 1
  buckets=${BUCKETS:-8,16,32}; max=${buckets##*,}  # the stage's default (max_batch 32); musetalk-product reuses the cache
  mt() {  # name, then extra flags
    local name=$1; shift
    timeout "${T:-200}" python3 bench/bench_lipsync_grpc.py --model musetalk --musetalk-dir "$models" --device cuda \
      --max-batch "$max" --batch-buckets "$buckets" --streams "${STREAMS:-24}" --items "${ITEMS:-8}" --window 2 --procs 2 \
      --crops 16 --max-rel-error 0.1 --compile-cache-dir "$cache" --seconds "${MT_SECONDS:-20}" --warmup-seconds 5 \
      --log-level INFO --keep-log "$OUT/$name.log" --out "$OUT/$name.json" "$@" 2>&1 | grep -E '^\||SERVING|rror' | tail -3 \
      | tee "$OUT/$name.txt"
  }
  runs=" ${MT_RUNS:-exact warm guard fast mad eager} "  # which of the runs below (a call's time is short)
  # (a) compiled, exact (a cold compile: its start-up includes it)
  [[ $runs == *" exact "* ]] && T=300 mt musetalk-compile-exact --backend compile
  # (c) a pod's start from the warm compile cache (the same cache dir, Inductor's local cache emptied)
  export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)
  [[ $runs == *" warm "* ]] && T=120 MT_SECONDS=8 mt musetalk-compile-warm-start --backend compile
  # where a start's numerics guard spends its time (the generator's fp32 reference: copy, move, run; cudnn autotune)
  [[ $runs == *" guard "* ]] && timeout 120 python3 - "$models" <<'PY' 2>&1 | tail -8 | tee "$OUT/musetalk-guard-timing.txt"
import copy, sys, time, torch
from services.inference.backends.numerics import strict_fp32
from services.lipsync.musetalk.networks import load_networks
root = sys.argv[1]
t = time.perf_counter()
nets = load_networks(f"{root}/musetalkV15/unet.pth", f"{root}/musetalkV15/musetalk.json", f"{root}/sd-vae", f"{root}/whisper")
print(f"load_networks {time.perf_counter() - t:.2f} s")
gen = torch.Generator().manual_seed(0)
x = (torch.randn((8, 8, 32, 32), generator=gen) * 0.5, torch.rand((8, 50, 384), generator=gen))
torch.backends.cudnn.benchmark = True
for bench in (True, False, True):
    torch.backends.cudnn.benchmark = bench
    t = time.perf_counter(); m = copy.deepcopy(nets.generator).eval(); t1 = time.perf_counter()
    m = m.to("cuda"); torch.cuda.synchronize(); t2 = time.perf_counter()
    with torch.inference_mode(), strict_fp32():
        m(*[v.cuda() for v in x]).float().cpu()
    t3 = time.perf_counter()
    print(f"cudnn.benchmark={bench}: deepcopy {t1 - t:.2f} s, to(cuda) {t2 - t1:.2f} s, fp32 run {t3 - t2:.2f} s")
    del m; torch.cuda.empty_cache()
PY
  export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)  # (b) below compiles cold again: its own cache key
  # (b) compiled, fast decode (its own compile-cache key: another cold compile)
  [[ $runs == *" fast "* ]] && [ "$SECONDS" -lt 300 ] && T=240 mt musetalk-compile-fast --backend compile --fast-decode
  # the fast decode's difference to the exact decode on the same inputs (eager fp16, the seeded networks)
  [[ $runs == *" mad "* ]] && [ "$SECONDS" -lt 420 ] && timeout 90 python3 - "$models" "$OUT/musetalk-fast-vs-exact.json" <<'PY' 2>&1 | tail -3
import json, sys, torch
from services.lipsync.musetalk.networks import FAST_DECODE_FIRST_ROW, load_networks
root = sys.argv[1]
paths = dict(unet=f"{root}/musetalkV15/unet.pth", unet_config=f"{root}/musetalkV15/musetalk.json", vae=f"{root}/sd-vae", whisper=f"{root}/whisper")
exact, fast = (load_networks(**paths, fast_decode=f).generator.cuda().half().eval() for f in (False, True))
gen = torch.Generator().manual_seed(0)
lat, tok = torch.randn((16, 8, 32, 32), generator=gen) * 0.5, torch.rand((16, 50, 384), generator=gen)
with torch.inference_mode():
    a, b = (g(lat.cuda().half(), tok.cuda().half()).float() for g in (exact, fast))
rows = slice(111, 256)  # the face rows the avatar's alpha can reach (tests/unit/lipsync/musetalk/test_networks.py)
d = (a[:, :, rows] - b[:, :, rows]).abs()
out = dict(mean_abs_diff=d.mean().item(), mean_abs_diff_255=d.mean().item() * 255, max_abs_diff=d.max().item(),
           exact_std=a[:, :, rows].std().item(), rows="111-255", first_row=FAST_DECODE_FIRST_ROW, batch=16, weights="seeded")
json.dump(out, open(sys.argv[2], "w"), indent=2)
print("| fast vs exact | mean abs diff %.4f (%.2f of 255) | max %.3f | exact std %.3f |" % (out["mean_abs_diff"], out["mean_abs_diff_255"], out["max_abs_diff"], out["exact_std"]))
PY
  # (d) eager fp16 + CUDA graphs (no compile), for comparison
  [[ $runs == *" eager "* ]] && [ "$SECONDS" -lt 470 ] && T=70 MT_SECONDS=12 mt musetalk-eager-fp16 --backend torch
  echo "musetalk phase: ${SECONDS}s" | tee -a "$OUT/musetalk-imports.txt"
  python3 - "$OUT" <<'PY' | tee "$OUT/musetalk-table.txt"
import json, sys
from pathlib import Path
print("| run | model | backend | frames/s | p50 ms | p99 ms | est. batch | start-up s |")
print("|---|---|---|---:|---:|---:|---:|---:|")
for f in sorted(Path(sys.argv[1]).glob("musetalk-*.json")):
    r = json.loads(f.read_text())
    if "frames_per_s" not in r:
        continue
    m = r.get("model") or {}
    print(f"| {f.stem} | {m.get('name', '?')} | {m.get('backend', '?')} | {r['frames_per_s']:,.1f} | {r['latency_p50_ms']:.1f} "
          f"| {r['latency_p99_ms']:.1f} | {r['est_batch_mean']:.1f} | {r['startup_s']:.1f} |")
PY
  ;;
musetalk-product)  # issue 30: a 60 s 720p clip on the tier, then live 256-tier sessions (after `musetalk` on the same
  # warm machine: its seeded folder, warm compile cache and .devsite (diffusers, grpcio, OpenCV 4) stay; carry .whlav (PyAV))
  models=$PWD/var/musetalk-seeded; cache=$PWD/var/compile-cache-musetalk
  [ -f "$models/musetalkV15/unet.pth" ] || python3 -c "from services.lipsync.musetalk.seeded import write_seeded_networks as w; import sys; w(sys.argv[1])" "$models" || exit 1
  buckets=${BUCKETS:-8,16,32}  # as the musetalk phase: its compile cache fits
  mflags="--backend=compile --compile-cache-dir=$cache --batch-buckets=$buckets --max-batch=${buckets##*,} --max-rel-error=0.1 ${MT_FLAGS:-}"
  if [ -z "${SKIP_E2E:-}" ]; then
    timeout 240 python3 bench/bench_e2e.py --model musetalk --musetalk-dir "$models" --musetalk-flags "$mflags" \
      --device cuda --super-resolution off --warmup-seconds 64 --log-level INFO --workdir "$OUT/e2e-mt-work" \
      --out "$OUT/e2e-musetalk-720p-60s.json" 2>&1 | grep -vE '^\s*$' | tail -25 | tee "$OUT/e2e-musetalk.txt"
    for log in "$OUT"/e2e-mt-work/cluster/lipsync-musetalk*.log; do [ -f "$log" ] && tail -300 "$log" > "$OUT/e2e-$(basename "$log")"; done
    rm -rf "$OUT"/e2e-mt-work
  fi
  name=live-musetalk-512-${COUNTS:-12,18,24}
  timeout $(( 570 - SECONDS )) python3 bench/bench_live.py --model musetalk --musetalk-dir "$models" --musetalk-flags "$mflags" \
    --device cuda --size 512x512 --preset ultrafast --codec h264 --session-counts "${COUNTS:-12,18,24}" \
    --seconds "${LIVE_SECONDS:-15}" --warmup-seconds 8 --live-workers "${LIVE_WORKERS:-4}" --gateways 2 --procs 2 \
    --log-level INFO --workdir "$OUT/$name-work" --out "$OUT/$name.json" 2>&1 | grep -vE '^\s*$' | tail -30 | tee "$OUT/$name.txt"
  for log in "$OUT/$name-work"/cluster/{lipsync-musetalk,live}*.log; do [ -f "$log" ] && tail -500 "$log" > "$OUT/$name-$(basename "$log")"; done
  rm -rf "$OUT/$name-work"
  echo "musetalk-product phase: ${SECONDS}s"
  ;;
*) echo "usage: $0 services|compile|aac|e2e|jobs|verify|live|live-profile|autoscale|scaleout|musetalk|musetalk-product [...]" >&2; exit 2 ;;
esac
# At most 8 files come back from a device call: pack the results into one archive.
pack=${pack:-$phase}  # scaleout: one archive per step and N list
( cd "$OUT" && find . -type f \( -name '*.json' -o -name '*.txt' -o -name '*.log' \) ! -name "$pack.tgz" -print0 \
    | tar czf "$pack.tgz" --null -T - && find . -mindepth 1 ! -name "*.tgz" -delete )  # earlier phases' archives stay
ls -la "$OUT"
