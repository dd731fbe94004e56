# run G6 (session 31): on one H200, AG+GEMM's GEMM per shape, 4 configs as the plain tile loop and with the last wave
# split (bench_gemm_configs --split): which config 8192x2752x4096 should take on H200 (G5: the table's 0.93)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/g6; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 200 env GPUS=1 bash launch.sh benchmarks/bench_gemm_configs.py --split --workers 16 --json $D/split.json > $D/split.log 2>&1; echo "split rc=$? at ${SECONDS}s"
grep -a -E "^\||Error|error|Traceback" $D/split.log | head -40
