#!/usr/bin/env bash
# The GPU tier in one go, on a machine with 1-4 GPUs (the project's GPU machine):
#   bash tests/gpu/run_gpu_tier.sh OUTDIR tests                # every gpu / multigpu test, in three parts
#   bash tests/gpu/run_gpu_tier.sh OUTDIR ranks1,ranks2,ranks4 # the same parts, named: one-GPU tests, 2 ranks, 4 ranks
#   bash tests/gpu/run_gpu_tier.sh OUTDIR ranks4@1/2          # half 1 of world size 4's tests (a part that fits one
#                                                             # GPU command of 10 minutes; ranks4@2/2 the rest)
#   bash tests/gpu/run_gpu_tier.sh OUTDIR build_modes,allgather,put_bw,fused,host  # the benchmarks
#   (host: host time per eager call of the ops and a captured AllGather's replays, benchmarks/bench_host.py, on
#   HOST_RANKS ranks, default the GPUs found, sharing GPUs when there are fewer: HOST_RANKS=2 on one GPU)
#   ... collectives,profile,soak,soak_all,gemm_configs (SOAK_ITERS=N shortens the soaks; soak_all: every op on
#   SOAK_RANKS ranks, default 4, sharing GPUs when there are fewer; SOAK_OPS=a,b a subset, to split it over
#   several commands: on one shared GPU a call takes ~7 ms, so 10,000 calls of every op take ~10 minutes;
#   with TILESCALE_MPS=1 in the environment launch.sh runs the ranks under MPS: all of it in one
#   command on one H100)
# (PYTEST_K=expr narrows the tests.) With fewer GPUs than ranks the multi-rank tests run with ranks sharing
# GPUs (TILESCALE_RANKS_PER_GPU; gloo / recomputed references instead of NCCL): correctness only.
# The parts of `tests` run side by side (PARALLEL=0: one after the other), each bounded by PART_TIMEOUT
# seconds (default 480); the kernel cache is shared, and tests/gpu/prebuild_tier.py compiles the multi-rank
# tests' kernels once, side by side, before the parts start.
# Every step is bounded by `timeout`; logs and JSON go to OUTDIR; a short summary is printed last.
set -u
OUTD=${1:?usage: run_gpu_tier.sh OUTDIR tests|ranks1,ranks2,ranks4|bench...}
WHAT=${2:-tests}
mkdir -p "$OUTD"
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
export TILESCALE_WAIT_TIMEOUT_S=${TILESCALE_WAIT_TIMEOUT_S:-30}
export TILESCALE_SKIP_DOCTOR=${TILESCALE_SKIP_DOCTOR:-1}  # the doctor runs once, above the steps
PART_TIMEOUT=${PART_TIMEOUT:-480}
# every job a test launches leaves its whole output, each line stamped with its time, in OUTDIR/jobs
export TILESCALE_TEST_LOG_DIR=${TILESCALE_TEST_LOG_DIR:-$OUTD/jobs}
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
  grep -a -E "^\| |^mode:|MET|MISSED|target|PASS|FAIL|passed|failed|error|Error" "$OUTD/$name.log" | grep -v "INFO\]" | tail -40
}
tier_part() {  # tier_part N I K NAME: the gpu / multigpu tests of world size N (shard I of K), in a pytest of its own
  local n=$1 i=$2 k=$3 name=$4 t0=$SECONDS rc
  local marker="multigpu"; [ "$n" = 1 ] && marker="gpu"
  # a temporary folder of its own: pytests side by side would otherwise prune each other's pytest-of-$USER
  local bt; bt=$(mktemp -d "${TMPDIR:-/tmp}/tilescale-tier.XXXXXX")
  timeout -k 10 "$PART_TIMEOUT" python3 -m pytest -m "$marker" --ranks "$n" --shard "$i/$k" -v -rs \
    --timeout $((PART_TIMEOUT - 20)) -p no:cacheprovider --basetemp "$bt/pytest" --durations=15 \
    ${PYTEST_K:+-k "$PYTEST_K"} tests examples > "$OUTD/$name.log" 2>&1
  rc=$?
  rm -rf "$bt"
  local counts
  counts=$(grep -a -E "^=+ .*(passed|failed|error|skipped|deselected).* in [0-9.]+s" "$OUTD/$name.log" | tail -1 | tr -d '=')
  echo "$name (world size $n, $([ "$n" -gt "$NG" ] && echo "ranks sharing $NG GPU(s)" || echo "distinct GPUs"), shard $i/$k): rc=$rc in $((SECONDS - t0)) s:${counts:- no pytest summary (timed out?)}" \
    > "$OUTD/$name.summary"
  echo "--- $(cat "$OUTD/$name.summary")"
  grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)" "$OUTD/$name.log" | grep -v "INFO\]" | tail -60
}
for what in ${WHAT//,/ }; do
  case $what in
    tests|ranks[124]|ranks[124]@[0-9]*/[0-9]*)
      # The parts run side by side (PARALLEL=0: one after the other); world sizes 2 and 4 in SHARDS shards
      # each (ranksN@h/H: the h-th of H halves of them, each in SHARDS shards). Ranks share the GPU(s): a
      # smaller symmetric heap per rank keeps them all in memory.
      export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-1G}
      parts=$what; [ "$what" = tests ] && parts="ranks1 ranks2 ranks4"
      # The kernels of the tests, compiled once for their world sizes before the parts start (PREBUILD=0:
      # each test compiles its own on first use); a failure here only makes the parts slower.
      sizes=$(for p in $parts; do p=${p%%@*}; echo "${p#ranks}"; done | sort -u)
      if [ "${PREBUILD:-1}" = 1 ]; then
        step prebuild "${PREBUILD_TIMEOUT:-300}" python3 tests/gpu/prebuild_tier.py $sizes
      fi
      pids=(); names=()
      for part in $parts; do
        n=${part%%@*}; n=${n#ranks}; h=1; H=1
        if [ "$part" != "${part#*@}" ]; then hh=${part#*@}; h=${hh%/*}; H=${hh#*/}; fi
        if ! [ "$h" -ge 1 ] 2>/dev/null || [ "$h" -gt "$H" ]; then echo "$part: expected ranksN@h/H with 1 <= h <= H" >&2; exit 2; fi
        k=${SHARDS:-3}; [ "$n" = 1 ] && k=1
        for s in $(seq "$k"); do
          i=$(( h + H * (s - 1) ))    # shard i of H x k: this half's s-th
          name="ranks$n$([ "$H" -gt 1 ] && echo "h$h")$([ "$k" -gt 1 ] && echo ".$s")"
          names+=("$name")
          if [ "${PARALLEL:-1}" = 1 ]; then tier_part "$n" "$i" $((H * k)) "$name" & pids+=($!)
          else tier_part "$n" "$i" $((H * k)) "$name"; fi
        done
      done
      for p in "${pids[@]}"; do wait "$p"; done
      for name in "${names[@]}"; do
        [ -f "$OUTD/$name.summary" ] && summary+=("$(cat "$OUTD/$name.summary")")
      done
      for n in 1 2 4; do   # counts per world size, over its shards (pytest -v's one line per test)
        res="^(tests|examples)/[^ ]+::[^ ]+ "
        tot=$(cat "$OUTD"/ranks$n*.log 2>/dev/null | grep -a -c -E "${res}PASSED" )
        bad=$(cat "$OUTD"/ranks$n*.log 2>/dev/null | grep -a -c -E "${res}(FAILED|ERROR)" )
        skp=$(cat "$OUTD"/ranks$n*.log 2>/dev/null | grep -a -c -E "${res}SKIPPED" )
        summary+=("world size $n: $tot passed, $bad failed, $skp skipped")
      done ;;
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
    soak_all) sr=${SOAK_RANKS:-4}; rpg=""; [ "$NG" -gt 0 ] && [ "$sr" -gt "$NG" ] && rpg=$(( (sr + NG - 1) / NG ))
             step soak_collectives 560 env GPUS="$sr" ${rpg:+TILESCALE_RANKS_PER_GPU="$rpg"} bash launch.sh \
             benchmarks/soak_collectives.py --json "$OUTD/soak_all.json" --budget-s 480 \
             ${SOAK_ITERS:+--iters "$SOAK_ITERS"} ${SOAK_OPS:+--ops "$SOAK_OPS"} ;;
    host) hr=${HOST_RANKS:-$NG}; rpg=""; [ "$NG" -gt 0 ] && [ "$hr" -gt "$NG" ] && rpg=$(( (hr + NG - 1) / NG ))
             step bench_host 420 env GPUS="$hr" ${rpg:+TILESCALE_RANKS_PER_GPU="$rpg"} bash launch.sh \
             benchmarks/bench_host.py --json "$OUTD/host.json" ;;
    gemm_configs) step bench_gemm_configs 300 env GPUS=1 bash launch.sh benchmarks/bench_gemm_configs.py \
             --json "$OUTD/gemm_configs.json" ;;
    *) echo "unknown step $what (tests, ranks1, ranks2, ranks4, build_modes, allgather, put_bw, fused, collectives, profile, soak, soak_all, gemm_configs, host)"; exit 2 ;;
  esac
done
echo "== summary"; printf '%s\n' "${summary[@]}"
