# run D3 (session 28): GEMM+RS's push kernel on one persistent block per SM (each pushed tile counted after the
# block's next tile is computed) vs one block per tile; the pull path's GEMM made persistent the same way
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/d3; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
STEP_TIMEOUT=330 timeout 340 bash benchmarks/run_one_gpu.sh $D/t push > $D/steps.log 2>&1; echo "push rc=$? at ${SECONDS}s"
grep -a -E "^\||relative|Error|error|Traceback" $D/t/push.log | head -30
tail -5 $D/t/push.log
