# run D7 (session 28): GEMM+RS's push kernel with its call number read at the start and counted at the end
# (T.call_number_read / commit / settle: no awaited atomic before the main loop) vs the committed kernel
# (.bench-old = 33c1133), then multi-rank correctness of the new kernel, ranks sharing the GPU
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/d7; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
STEP_TIMEOUT=200 timeout 210 bash benchmarks/run_one_gpu.sh $D/new push > $D/new_steps.log 2>&1; echo "new rc=$? at ${SECONDS}s"
grep -a -E "^\||relative|Error|Traceback" $D/new/push.log | head -14
(cd .bench-old && PYTHONPATH="$PWD:$PYTHONPATH" STEP_TIMEOUT=150 timeout 160 bash benchmarks/run_one_gpu.sh $D/old push > $D/old_steps.log 2>&1; echo "old rc=$? at ${SECONDS}s")
grep -a -E "^\||relative|Error|Traceback" $D/old/push.log | head -14
export TILESCALE_TEST_LOG_DIR=$D/jobs
B=$(mktemp -d); L=$((585 - SECONDS))
run() { local name=$1; shift; ( timeout $L python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
E=examples/distributed
run a2 --ranks 2 $E/example_gemm_reducescatter.py tests/test_graphs_gpu.py::test_fused_ops_replay_from_cuda_graphs
run b4 --ranks 4 $E/example_gemm_reducescatter.py $E/example_tp_layer.py
wait
rm -rf $B
for f in $D/a2.log $D/b4.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $f | grep -v INFO | tail -6; done
grep -a -h -E "OK:|Error:" $D/jobs/*.log 2>/dev/null | cut -c1-200 | sort | uniq | tail -12
echo "shm: $(ls /dev/shm | grep -c cuda.shm)"
cd $OUT && tar czf d7jobs.tgz d7/jobs 2>/dev/null && rm -rf d7/jobs
