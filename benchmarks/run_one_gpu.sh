#!/usr/bin/env bash
# Issue 15's one-GPU measurements, each bounded, logs and JSON under OUTDIR:
#
#   bash benchmarks/run_one_gpu.sh OUTDIR [STEPS]      # STEPS: comma-separated, default all, in this order:
#
#   sweep    bench_gemm_configs.py: the fused ops' GEMM (AG+GEMM's TMA epilogue, GEMM+RS's TMA store + counts)
#            per tile config vs cuBLAS, every per-rank shape at W = 2, 4, 8 -> OUTDIR/gemm_configs.json, and the
#            tuning table made from it -> OUTDIR/gemm_tuning.json (INSTALL_TUNING=1: also copied to
#            tilescale/ops/gemm_tuning.json, so the steps after it run the tuned configs)
#   push     bench_gemm_configs.py --push: GEMM+RS's push kernel (rank 0's work of W, on this GPU alone) with its
#            tuned config per shape and W vs cuBLAS and the pull path's GEMM -> OUTDIR/gemm_rs_push.json
#   modes    bench_build_modes.py: plain tilelang vs @tilescale.jit, inlined and rdc build modes, cuBLAS
#   ws1      bench_fused.py at world size 1: each fused op vs cuBLAS alone (the yardstick: <= 1.03), calls interleaved
#   host     bench_host.py at world size 1: host us per call
#   profile  profile_ag_gemm.py at world size 1: the profiler's overheads
#
# Each step runs through launch.sh with GPUS=1 and is bounded by STEP_TIMEOUT (s, default 300); a step that
# fails or times out is reported and the next one runs. Exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${1:?usage: run_one_gpu.sh OUTDIR [STEPS]}
STEPS=${2:-sweep,push,modes,ws1,host,profile}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
for s in ${STEPS//,/ }; do   # every step known, or nothing runs
  case $s in sweep|push|modes|ws1|host|profile) ;;
    *) echo "run_one_gpu.sh: unknown step '$s' (expected sweep, push, modes, ws1, host, profile)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
failed=0

step() {   # step NAME COMMAND...
  local name=$1
  shift
  echo "== $name: $*" | tee -a "$OUT/steps.log"
  local t0=$SECONDS
  timeout -k 10 "$STEP_TIMEOUT" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/steps.log"
  tail -n 40 "$OUT/$name.log"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

for s in ${STEPS//,/ }; do
  case $s in
    sweep)
      step sweep env GPUS=1 bash launch.sh benchmarks/bench_gemm_configs.py --json "$OUT/gemm_configs.json"
      if [ -f "$OUT/gemm_configs.json" ]; then
        python3 benchmarks/bench_gemm_configs.py --write-tuning "$OUT/gemm_tuning.json" --from "$OUT/gemm_configs.json"
        [ "${INSTALL_TUNING:-0}" = 1 ] && cp "$OUT/gemm_tuning.json" tilescale/ops/gemm_tuning.json
      fi ;;
    push) step push env GPUS=1 bash launch.sh benchmarks/bench_gemm_configs.py --push --json "$OUT/gemm_rs_push.json" ;;
    modes) step modes env GPUS=1 bash launch.sh benchmarks/bench_build_modes.py --json "$OUT/build_modes.json" ;;
    ws1) step ws1 env GPUS=1 bash launch.sh benchmarks/bench_fused.py --op both --json "$OUT/fused_ws1.json" ;;
    host) step host env GPUS=1 bash launch.sh benchmarks/bench_host.py --json "$OUT/host_w1.json" ;;
    profile) step profile env GPUS=1 bash launch.sh benchmarks/profile_ag_gemm.py --out "$OUT/profile" ;;
  esac
done
echo "run_one_gpu.sh: $failed step(s) failed"
exit "$failed"
