# run J3 (session 33): J2 with the accumulator cleared by wgmma scale-d (clear_accum=ko == 0) instead of T.clear
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/j3; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
GPUS=1 timeout 420 bash launch.sh benchmarks/bench_gemm_configs.py --push --json $D/push.json > $D/push.log 2>&1; echo "push rc=$? at ${SECONDS}s"
grep -a -E "^\| [248] |Error|error|prebuild" $D/push.log | head -20
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
