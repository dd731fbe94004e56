# run G2 (session 31): does the order of the columns move bench_fused's ws1 numbers? AG+GEMM at world size 1 timed
# in turns (as runs 20-25), in turns in the reverse order, and interleaved call by call; GEMM+RS interleaved
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/g2; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
for v in "turns:--timing turns --op ag_gemm" "reverse:--timing turns --reverse --op ag_gemm" "inter:--timing interleaved --op both" "turns2:--timing turns --op ag_gemm" "inter2:--timing interleaved --op ag_gemm"; do
  n=${v%%:*}; a=${v#*:}
  GPUS=1 timeout 150 bash launch.sh benchmarks/bench_fused.py $a --json $D/$n.json > $D/$n.log 2>&1; echo "$n rc=$? at ${SECONDS}s"
  grep -a -E "^\||interleaved timing|Error|Traceback" $D/$n.log | head -16
done
cd $OUT && tar czf g2.tgz g2
