# run E1 (session 29): the host clocks and the profiler's record on this machine; AG+GEMM's GEMM with the last wave
# split along K (bench_gemm_configs --split) vs the tile loop vs cuBLAS
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/e1; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
# timeout 120 env GPUS=1 bash launch.sh benchmarks/probe_host_clock.py > $D/clock.log 2>&1; echo "clock rc=$? at ${SECONDS}s"
# grep -a -v "TileLang\|^\s*$" $D/clock.log | tail -16
timeout 420 env GPUS=1 bash launch.sh benchmarks/bench_gemm_configs.py --split --workers 16 --json $D/split.json > $D/split.log 2>&1; echo "split rc=$? at ${SECONDS}s"
grep -a -E "^\||Error|error|Traceback" $D/split.log | head -60
echo "shm: $(ls /dev/shm | grep -c cuda.shm)"
