# run G5 (session 31): issue 15's world-size-1 step on one H200 (tree 750da7e; interleaved timing), the H200 entries
# of the tuning table
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/g5; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
STEP_TIMEOUT=230 timeout 240 bash benchmarks/run_one_gpu.sh $D/t ws1 > $D/steps_out.log 2>&1; echo "ws1 rc=$? at ${SECONDS}s"
grep -a -E "^\|.*(MxKxN|[0-9]x[0-9])|interleaved timing|Error|Traceback" $D/t/ws1.log | head -16
cd $OUT && tar czf g5.tgz g5
