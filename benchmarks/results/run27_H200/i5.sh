# run I5 (session 32): the ring push kernel on 4 distinct GPUs (tree 371521f): bench_fused --op gemm_rs at world
# size 4 (every shape checked against torch first), then GEMM+RS's example (push and pull, bf16 and fp16) at 4 ranks
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/i5; mkdir -p $D; export TILESCALE_TEST_LOG_DIR=$D/jobs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
GPUS=4 timeout 150 bash launch.sh benchmarks/bench_fused.py --op gemm_rs --json $D/fused_w4.json > $D/fused_w4.log 2>&1; echo "fused rc=$? at ${SECONDS}s"
grep -a -E "^\||interleaved|Error" $D/fused_w4.log | head -8
L=$((235 - SECONDS))
B=$(mktemp -d)
timeout $L python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/t --ranks 4 examples/distributed/example_gemm_reducescatter.py > $D/t4.log 2>&1; echo "t4 rc=$? at ${SECONDS}s"
rm -rf $B
grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $D/t4.log | grep -v INFO | tail -4
grep -a -h -E "OK:|Error:" $D/jobs/*.log 2>/dev/null | cut -c1-180 | sort | uniq | tail -4
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf i5.tgz i5 && rm -rf i5/jobs
