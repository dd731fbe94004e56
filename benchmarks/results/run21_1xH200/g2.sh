# run G2 (session 26): push kernel with the fold through shared memory; world size 1; multi-rank regression
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/g2; mkdir -p $D; export TILESCALE_TEST_LOG_DIR=$D/jobs
STEP_TIMEOUT=210 timeout 220 bash benchmarks/run_one_gpu.sh $D/t push > $D/push_step.log 2>&1; echo "push rc=$? at ${SECONDS}s"
grep -a -E "^\|" $D/t/push.log | tail -14
STEP_TIMEOUT=120 timeout 125 bash benchmarks/run_one_gpu.sh $D/t ws1 > $D/ws1_step.log 2>&1; echo "ws1 rc=$? at ${SECONDS}s"
grep -a -E "^\|" $D/t/ws1.log | tail -14
B=$(mktemp -d); L=$((575 - SECONDS))
run() { local name=$1; shift; ( timeout $L python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
E=examples/distributed
run a2 --ranks 2 $E/example_gemm_reducescatter.py tests/test_graphs_gpu.py::test_fused_ops_replay_from_cuda_graphs tests/test_gemm_config.py $E/example_tp_layer.py
run b4 --ranks 4 $E/example_gemm_reducescatter.py tests/test_graphs_gpu.py::test_fused_ops_replay_from_cuda_graphs
wait
rm -rf $B
for f in $D/a2.log $D/b4.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $f | grep -v INFO | tail -8; done
grep -a -h -E "OK:|Error:" $D/jobs/*.log 2>/dev/null | cut -c1-200 | sort | uniq | tail -20
echo "shm: $(ls /dev/shm | grep -c cuda.shm)"
