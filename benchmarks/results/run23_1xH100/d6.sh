# run D6 (session 28): as D5, plus tma_cn: the tile loop after a T.call_number (the per-block atomic
# the fused kernels await before their main loop)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/d6; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
STEP_TIMEOUT=330 timeout 340 bash benchmarks/run_one_gpu.sh $D/t push > $D/steps.log 2>&1; echo "push rc=$? at ${SECONDS}s"
grep -a -E "^\||relative|Error|error|Traceback" $D/t/push.log | head -30
tail -3 $D/t/push.log
