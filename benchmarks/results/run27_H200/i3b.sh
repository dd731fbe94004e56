# run I3b (session 32): multi-rank correctness of the final tree, ranks sharing the GPU (correctness only): GEMM+RS
# (ring push and pull, one count per tile on both) at 2 ranks, CUDA graphs of the fused ops at 2, the pull path across
# emulated nodes and GEMM+RS (push and pull) at 4
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/i3b; mkdir -p $D; export TILESCALE_TEST_LOG_DIR=$D/jobs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
B=$(mktemp -d); L=$((570 - SECONDS))
run() { local name=$1; shift; ( timeout $L python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
E=examples/distributed
run a2 --ranks 2 $E/example_gemm_reducescatter.py tests/test_graphs_gpu.py::test_fused_ops_replay_from_cuda_graphs
run c4 --ranks 4 $E/example_gemm_reducescatter.py tests/test_gpu_remote.py
wait
rm -rf $B
for f in $D/a2.log $D/c4.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $f | grep -v INFO | tail -12; done
grep -a -h -E "OK:|Error:" $D/jobs/*.log 2>/dev/null | cut -c1-200 | sort | uniq | tail -16
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf i3b.tgz i3b && rm -rf i3b/jobs
