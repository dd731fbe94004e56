# run I2 (session 32): multi-rank correctness of the ring push kernel, ranks sharing the GPU (correctness only):
# GEMM+RS's example (push and pull) at 2 and 4 ranks, CUDA graphs of the fused ops, the TP layer, non-default
# configs, bad input
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/i2; mkdir -p $D; export TILESCALE_TEST_LOG_DIR=$D/jobs
B=$(mktemp -d); L=$((570 - SECONDS))
run() { local name=$1; shift; ( timeout $L python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
E=examples/distributed
run a2 --ranks 2 $E/example_gemm_reducescatter.py tests/test_graphs_gpu.py::test_fused_ops_replay_from_cuda_graphs tests/test_gpu_runtime.py::test_bad_input_matrix
run b4 --ranks 4 $E/example_gemm_reducescatter.py $E/example_tp_layer.py tests/test_gemm_config.py
wait
rm -rf $B
for f in $D/a2.log $D/b4.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $f | grep -v INFO | tail -12; done
grep -a -h -E "OK:|Error:" $D/jobs/*.log 2>/dev/null | cut -c1-200 | sort | uniq | tail -24
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf i2.tgz i2 && rm -rf i2/jobs
