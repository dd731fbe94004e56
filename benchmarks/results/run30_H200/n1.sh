# run N1 (session 35): the push kernel with the sums pushed by plain stores (commit in the log): GEMM+RS's push kernel on one GPU
# (bench_gemm_configs --push), then multi-rank correctness with ranks sharing the GPU (correctness only): GEMM+RS's
# example (push and pull, bf16 and fp16, vs torch and NCCL) at 2 and 4 ranks, the fused ops' CUDA graphs and the TP
# layer at 2 ranks, the non-default configs at 2 and 4 ranks
source .device/prelude.sh
git log --oneline -1 2>/dev/null || true
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/n1; mkdir -p $D; export TILESCALE_TEST_LOG_DIR=$D/jobs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
GPUS=1 timeout 250 bash launch.sh benchmarks/bench_gemm_configs.py --push --json $D/push.json > $D/push.log 2>&1; echo "push rc=$? at ${SECONDS}s"
grep -a -E "^\| [248] |Error|error|prebuild" $D/push.log | head -20
B=$(mktemp -d); L=$((580 - SECONDS))
run() { local name=$1; shift; ( timeout $L python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
E=examples/distributed
run a2 --ranks 2 $E/example_gemm_reducescatter.py tests/test_graphs_gpu.py::test_fused_ops_replay_from_cuda_graphs tests/test_gemm_config.py::test_fused_ops_with_non_default_configs_on_gpus $E/example_tp_layer.py
run c4 --ranks 4 $E/example_gemm_reducescatter.py tests/test_gemm_config.py::test_fused_ops_with_non_default_configs_on_gpus
wait
rm -rf $B
for f in $D/a2.log $D/c4.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $f | grep -v INFO | tail -12; done
grep -a -h -E "OK:|Error:" $D/jobs/*.log 2>/dev/null | cut -c1-200 | sort | uniq | tail -16
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf n1.tgz n1 && rm -rf n1/jobs
