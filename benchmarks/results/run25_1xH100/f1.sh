# run F1 (session 30): (a) tree 7137cae (the wait record's gate, not the pull order): AG+GEMM 8192x2752x1024 at 2 ranks
# sharing the H100: does it now stop with a wait record, and which wait? (b) the working tree (2fbdc55: pulls from
# this GPU end before the second GEMM; the split at every world size): the split test at 1, 2, 4 ranks, the
# injected hang (528 x 512 threads) at 2 and 4, AG+GEMM's graphs / example / profiler tests at 2, the example at 4
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/f1; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
git log --oneline -1 2>/dev/null
export TILESCALE_TEST_LOG_DIR=$D/jobs
B=$(mktemp -d)
run() { local name=$1 lim=$2; shift 2; ( timeout $lim python3 -m pytest -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
( cd .bench-old && PYTHONPATH="$PWD:$PYTHONPATH" GPUS=2 TILESCALE_RANKS_PER_GPU=2 TILESCALE_WAIT_TIMEOUT_S=10 timeout 150 bash launch.sh tests/gpu/ag_gemm_split_main.py > $D/old2.log 2>&1; echo "old tree (7137cae), 2 ranks: rc=$? at ${SECONDS}s" ) &
run s1 200 -m "gpu or multigpu" --ranks 1 tests/test_gemm_config.py -k split
wait
grep -a -E "OK:|gave up|Error|stops" $D/old2.log | cut -c1-400 | head -8
E=examples/distributed
run s2 400 -m multigpu --ranks 2 tests/test_gemm_config.py tests/test_gpu_runtime.py tests/test_graphs_gpu.py tests/test_profiler.py $E/example_allgather_gemm.py -k "split or injected_hang or fused_ops_replay or allgather_gemm or test_profiler"
run s4 400 -m multigpu --ranks 4 tests/test_gemm_config.py tests/test_gpu_runtime.py $E/example_allgather_gemm.py -k "split or injected_hang or allgather_gemm"
wait
rm -rf $B
for f in $D/s1.log $D/s2.log $D/s4.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED|XPASS|XFAIL)|passed|failed" $f | grep -v INFO | tail -12; done
grep -a -h -E "OK:|Error:|gave up" $D/jobs/*.log 2>/dev/null | cut -c1-260 | sed 's/^[0-9:. ]*//' | sort | uniq -c | tail -24
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf f1.tgz f1 && rm -rf f1/jobs
