# run F3 (session 30): 2 distinct H100s: AG+GEMM with the last waves split at 2 ranks (the peers' rows pulled by copy
# engines while tiles wait: nothing waited for before the second GEMM), eager calls and graph replays vs torch; the
# fused ops' graph test; the AG+GEMM example
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/f3; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; nvidia-smi topo -m | head -4
export TILESCALE_TEST_LOG_DIR=$D/jobs
B=$(mktemp -d)
timeout 400 python3 -m pytest -p no:cacheprovider -v -rs --basetemp $B/d2 -m multigpu --ranks 2 tests/test_gemm_config.py tests/test_graphs_gpu.py examples/distributed/example_allgather_gemm.py -k "split or fused_ops_replay or allgather_gemm" > $D/d2.log 2>&1; echo "d2 rc=$? at ${SECONDS}s"
rm -rf $B
grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $D/d2.log | grep -v INFO | tail -8
grep -a -h -E "OK:|Error:|gave up|distinct|sharing" $D/jobs/*.log 2>/dev/null | cut -c1-240 | sort | uniq | tail -12
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf f3.tgz f3
