#!/usr/bin/env bash
# First GPU check of the core: ring example (2 and 4 ranks, both build modes) and the build-mode GEMM.
OUTD=${1:-/tmp/ts_out}; mkdir -p "$OUTD"
export TILESCALE_SKIP_DOCTOR=1 TILESCALE_WAIT_TIMEOUT_S=20
nvidia-smi --query-gpu=index,name --format=csv,noheader
python3 -c "import torch, nvidia.nvshmem as n; print(torch.__version__, torch.cuda.device_count(), list(n.__path__))"
NG=$(nvidia-smi -L | wc -l)
for m in inlined rdc; do for n in 2 4; do [ $n -gt $NG ] && continue
  t0=$SECONDS
  timeout -k 5 150 env GPUS=$n bash launch.sh examples/distributed/example_ring_put.py --mode $m > "$OUTD/ring_${m}_$n.log" 2>&1
  echo "ring mode=$m n=$n rc=$? $((SECONDS-t0))s"; grep -a -E "OK|Error|error|rror:|Traceback|tilescale:" "$OUTD/ring_${m}_$n.log" | grep -v "INFO" | head -12
done; done
t0=$SECONDS
timeout -k 5 240 env GPUS=1 bash launch.sh benchmarks/bench_build_modes.py --repeats 3 --json "$OUTD/build_modes.json" > "$OUTD/gemm.log" 2>&1
echo "gemm rc=$? $((SECONDS-t0))s"; grep -a -v "INFO\|ptxas\|C75" "$OUTD/gemm.log" | tail -25
