# run D2 (session 28): GEMM+RS's push kernel, TMA store vs 16-byte stores by every thread ("push st"), and the
# pull path's GEMM with the same split (signal / signal_gpu / signal_st / tma)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/d2; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
STEP_TIMEOUT=280 timeout 290 bash benchmarks/run_one_gpu.sh $D/t push > $D/steps.log 2>&1; echo "push rc=$? at ${SECONDS}s"
grep -a -E "^\||relative|Error|error" $D/t/push.log | head -30
