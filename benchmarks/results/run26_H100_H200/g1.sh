# run G1 (session 31): the tile loop's warp policy (Square vs FullRow) and a persistent FullRow loop vs cuBLAS, per
# GEMM shape of the fused ops, one GPU, nothing else on it
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/g1; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
GPUS=1 timeout 500 bash launch.sh benchmarks/probe_gemm_policy.py --json $D/policy.json > $D/probe.log 2>&1; echo "probe rc=$? at ${SECONDS}s"
grep -a -v -E "INFO|WARNING" $D/probe.log | grep -a -E "^\||FAILED|Error|built|Traceback" | head -40
cd $OUT && tar czf g1.tgz g1
