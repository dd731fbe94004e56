#!/usr/bin/env bash
# The GPU tier in one go, on a machine with 1-4 GPUs (the project's GPU machine):
#   bash tests/gpu/run_gpu_tier.sh OUTDIR tests                       # pytest -m "gpu or multigpu"
#   bash tests/gpu/run_gpu_tier.sh OUTDIR build_modes,allgather,put_bw,fused  # the benchmarks
#   ... collectives,profile,soak,gemm_configs (SOAK_ITERS=N shortens the soak)
# (PYTEST_K=expr narrows the tests.)
# Every step is bounded by `timeout`; logs and JSON go to OUTDIR; a short summary is printed last.
set -u
OUTD=${1:?usage: run_gpu_tier.sh OUTDIR tests|bench}
WHAT=${2:-tests}
mkdir -p "$OUTD"
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
export TILESCALE_WAIT_TIMEOUT_S=${TILESCALE_WAIT_TIMEOUT_S:-30}
export TILESCALE_SKIP_DOCTOR=${TILESCALE_SKIP_DOCTOR:-1}  # the doctor runs once, above the steps
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x $NG; commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
python3 -m tilescale doctor --gpus "$NG" 2>&1 | tail -20
summary=()
step() {  # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout -k 10 "$secs" "$@" > "$OUTD/$name.log" 2>&1
  local rc=$?
  summary+=("$name: rc=$rc in $((SECONDS - t0)) s")
  echo "--- $name (rc=$rc, $((SECONDS - t0)) s)"
  grep -a -E "^\| |MET|MISSED|target|PASS|FAIL|passed|failed|error|Error" "$OUTD/$name.log" | grep -v "INFO\]" | tail -40
}
for what in ${WHAT//,/ }; do
  case $what in
    tests) step gpu_tests 560 python3 -m pytest -m "gpu or multigpu" -v -rs --timeout 500 -p no:cacheprovider \
             ${PYTEST_K:+-k "$PYTEST_K"} tests examples ;;
    build_modes) step bench_build_modes 200 env GPUS=1 bash launch.sh benchmarks/bench_build_modes.py --repeats 5 \
             --json "$OUTD/build_modes.json" ;;
    allgather) step bench_allgather 170 env GPUS="$NG" bash launch.sh benchmarks/bench_allgather.py \
             --json "$OUTD/allgather.json" --plot "$OUTD/allgather_busbw.png" ;;
    put_bw) step bench_put_bw 150 env GPUS="$NG" bash launch.sh benchmarks/bench_put_bw.py --json "$OUTD/put_bw.json" ;;
    fused) step bench_fused 420 env GPUS="$NG" bash launch.sh benchmarks/bench_fused.py --op both \
             --json "$OUTD/fused.json" ;;
    collectives) step bench_collectives 200 env GPUS="$NG" bash launch.sh benchmarks/bench_collectives.py \
             --json "$OUTD/collectives.json" --write-tuning "$OUTD/tuning_w$NG.json" ;;
    profile) step profile_ag_gemm 240 env GPUS="$NG" bash launch.sh benchmarks/profile_ag_gemm.py --out "$OUTD/profile" \
             --json "$OUTD/profile_ag_gemm.json" ;;
    soak) step soak_ag_gemm 240 env GPUS="$NG" bash launch.sh benchmarks/soak_ag_gemm.py --json "$OUTD/soak.json" \
             ${SOAK_ITERS:+--iters "$SOAK_ITERS"} ;;
    gemm_configs) step bench_gemm_configs 300 env GPUS=1 bash launch.sh benchmarks/bench_gemm_configs.py \
             --json "$OUTD/gemm_configs.json" ;;
    *) echo "unknown step $what (tests, build_modes, allgather, put_bw, fused, collectives, profile, soak, gemm_configs)"; exit 2 ;;
  esac
done
echo "== summary"; printf '%s\n' "${summary[@]}"
