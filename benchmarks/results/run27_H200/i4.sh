# run I4 (session 32): the ring push kernel on 2 distinct GPUs (tree b08f690): GEMM+RS's example (push and pull) and
# the fused ops' CUDA graphs at 2 ranks, then bench_fused --op gemm_rs at world size 2 (ours vs NCCL+cuBLAS, async-TP)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/i4; mkdir -p $D; export TILESCALE_TEST_LOG_DIR=$D/jobs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
B=$(mktemp -d)
timeout 220 python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/t --ranks 2 examples/distributed/example_gemm_reducescatter.py tests/test_graphs_gpu.py::test_fused_ops_replay_from_cuda_graphs > $D/t2.log 2>&1; echo "t2 rc=$? at ${SECONDS}s"
rm -rf $B
grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $D/t2.log | grep -v INFO | tail -6
grep -a -h -E "OK:|Error:" $D/jobs/*.log 2>/dev/null | cut -c1-180 | sort | uniq | tail -6
L=$((560 - SECONDS))
GPUS=2 timeout $L bash launch.sh benchmarks/bench_fused.py --op gemm_rs --json $D/fused_w2.json > $D/fused_w2.log 2>&1; echo "fused rc=$? at ${SECONDS}s"
grep -a -E "^\||interleaved|Error" $D/fused_w2.log | head -8
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf i4.tgz i4 && rm -rf i4/jobs
