# run H2 (session 27): multi-rank correctness of the final tree, ranks sharing the GPU (correctness only):
# both fused ops' examples (GEMM+RS push and pull), CUDA graphs of the fused ops, the TP layer, the remote path
# at 4 ranks (not run on the push path's tree before), bad input, non-default configs
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/h2; mkdir -p $D; export TILESCALE_TEST_LOG_DIR=$D/jobs
STEP_TIMEOUT=150 timeout 160 bash benchmarks/run_one_gpu.sh $D/m modes > $D/modes_step.log 2>&1; echo "modes rc=$? at ${SECONDS}s"; grep -a -E "^GEMM|^variant|^tilelang|^tilescale|^inlined|^rdc|^cuBLAS|target|NVSHMEM call" $D/m/modes.log
B=$(mktemp -d); L=$((560 - SECONDS))
run() { local name=$1; shift; ( timeout $L python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
E=examples/distributed
run a2 --ranks 2 $E/example_gemm_reducescatter.py $E/example_allgather_gemm.py tests/test_graphs_gpu.py::test_fused_ops_replay_from_cuda_graphs tests/test_gpu_runtime.py::test_bad_input_matrix
run b4 --ranks 4 $E/example_gemm_reducescatter.py $E/example_allgather_gemm.py $E/example_tp_layer.py tests/test_gemm_config.py
run c4 --ranks 4 tests/test_gpu_remote.py
wait
rm -rf $B
for f in $D/a2.log $D/b4.log $D/c4.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $f | grep -v INFO | tail -10; done
grep -a -h -E "OK:|Error:" $D/jobs/*.log 2>/dev/null | cut -c1-200 | sort | uniq | tail -24
echo "shm: $(ls /dev/shm | grep -c cuda.shm)"
cd $OUT && tar czf h2jobs.tgz h2/jobs && rm -rf h2/jobs
