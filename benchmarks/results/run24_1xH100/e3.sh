# run E3 (session 29): the sweep on this H100, installed as the tuning table (INSTALL_TUNING=1), then world size 1
# (bench_fused: AG+GEMM's GEMM with the split tail), then multi-rank correctness of the split tail, ranks sharing the GPU
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/e3; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
INSTALL_TUNING=1 STEP_TIMEOUT=230 timeout 240 bash benchmarks/run_one_gpu.sh $D/t sweep > $D/sweep_steps.log 2>&1; echo "sweep rc=$? at ${SECONDS}s"
cp tilescale/ops/gemm_tuning.json $D/installed_tuning.json
grep -a -E "^\|" $D/t/sweep.log | head -70
STEP_TIMEOUT=170 timeout 180 bash benchmarks/run_one_gpu.sh $D/t ws1 > $D/ws1_steps.log 2>&1; echo "ws1 rc=$? at ${SECONDS}s"
grep -a -E "^\||Error|Traceback" $D/t/ws1.log | head -30
export TILESCALE_TEST_LOG_DIR=$D/jobs
B=$(mktemp -d); L=$((590 - SECONDS))
run() { local name=$1; shift; ( timeout $L python3 -m pytest -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
E=examples/distributed
run s1 -m "gpu or multigpu" --ranks 1 tests/test_gemm_config.py -k split
run s2 -m multigpu --ranks 2 tests/test_gemm_config.py -k "split or non_default" $E/example_allgather_gemm.py tests/test_graphs_gpu.py::test_fused_ops_replay_from_cuda_graphs
run s4 -m multigpu --ranks 4 tests/test_gemm_config.py -k split $E/example_allgather_gemm.py
wait
rm -rf $B
for f in $D/s1.log $D/s2.log $D/s4.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $f | grep -v INFO | tail -8; done
grep -a -h -E "OK:|Error:" $D/jobs/*.log 2>/dev/null | cut -c1-220 | sort | uniq | tail -14
echo "shm: $(ls /dev/shm | grep -c cuda.shm)"
cd $OUT && tar czf e3jobs.tgz e3/jobs 2>/dev/null && rm -rf e3/jobs
