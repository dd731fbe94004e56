# run J8 (session 33): the final tree: GEMM+RS's push kernels (the op's pick: persistent for short K, the grid else)
# on one GPU (bench_gemm_configs --push), then multi-rank correctness with ranks sharing the GPU (correctness only):
# GEMM+RS's example on both kernels' shapes (push and pull, bf16 and fp16, vs torch and NCCL) and the fused ops' CUDA
# graphs at 2 ranks; the example at 4 ranks
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/j8; mkdir -p $D; export TILESCALE_TEST_LOG_DIR=$D/jobs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
GPUS=1 timeout 240 bash launch.sh benchmarks/bench_gemm_configs.py --push --json $D/push.json > $D/push.log 2>&1; echo "push rc=$? at ${SECONDS}s"
grep -a -E "^\| [248] |Error|error|prebuild" $D/push.log | head -20
B=$(mktemp -d); L=$((575 - SECONDS))
run() { local name=$1; shift; ( timeout $L python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
E=examples/distributed
run a2 --ranks 2 $E/example_gemm_reducescatter.py tests/test_graphs_gpu.py::test_fused_ops_replay_from_cuda_graphs
run c4 --ranks 4 $E/example_gemm_reducescatter.py
wait
rm -rf $B
for f in $D/a2.log $D/c4.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $f | grep -v INFO | tail -12; done
grep -a -h -E "OK:|Error:" $D/jobs/*.log 2>/dev/null | cut -c1-200 | sort | uniq | tail -16
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf j8.tgz j8 && rm -rf j8/jobs
