# run J1 (session 33): GEMM+RS push kernel (loopback) vs a persistent push kernel with one pipelined loop over (tile, K tile), and the flat persistent GEMM alone
# (tile, K tile), and the flat persistent GEMM alone; bench_gemm_configs --push on the working tree
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/j1; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
GPUS=1 timeout 420 bash launch.sh benchmarks/bench_gemm_configs.py --push --json $D/push.json > $D/push.log 2>&1; echo "push rc=$? at ${SECONDS}s"
grep -a -E "^\| [248] |Error|error|prebuild" $D/push.log | head -20
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
