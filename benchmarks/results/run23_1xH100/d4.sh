# run D4 (session 28): GEMM+RS's push path in two kernels (the peers' tiles, not counted; then my rows after one
# flag per peer) vs the one kernel that counts every tile
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/d4; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
STEP_TIMEOUT=330 timeout 340 bash benchmarks/run_one_gpu.sh $D/t push > $D/steps.log 2>&1; echo "push rc=$? at ${SECONDS}s"
grep -a -E "^\||relative|Error|error|Traceback" $D/t/push.log | head -30
tail -3 $D/t/push.log
