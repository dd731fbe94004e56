# run L4 (session 34): the review mends (commit in the command's log): GEMM+RS's push kernel on one GPU
# (bench_gemm_configs --push), then GEMM+RS's example at 2 and 4 ranks sharing the GPU (correctness only)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/l4; mkdir -p $D; export TILESCALE_TEST_LOG_DIR=$D/jobs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
GPUS=1 timeout 200 bash launch.sh benchmarks/bench_gemm_configs.py --push --json $D/push.json > $D/push.log 2>&1; echo "push rc=$? at ${SECONDS}s"
grep -a -E "^\| [248] |Error|error" $D/push.log | head -12
B=$(mktemp -d); L=$((540 - SECONDS))
run() { local name=$1; shift; ( timeout $L python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
run a2 --ranks 2 examples/distributed/example_gemm_reducescatter.py tests/test_gemm_config.py::test_fused_ops_with_non_default_configs_on_gpus
run c4 --ranks 4 examples/distributed/example_gemm_reducescatter.py
wait
rm -rf $B
for f in $D/a2.log $D/c4.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $f | grep -v INFO | tail -6; done
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf l4.tgz l4 && rm -rf l4/jobs
