# run G3 (session 26): issue 15's GEMM+RS rows on the push path: push kernel (op's config), world size 1, host time
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/g3; mkdir -p $D
STEP_TIMEOUT=200 timeout 570 bash benchmarks/run_one_gpu.sh $D/t push,ws1,host > $D/steps.log 2>&1; echo "steps rc=$? at ${SECONDS}s"
grep -a -E "^== |^\||target|floor|python" $D/steps.log | head -70
