# run F4 (session 30): tree 53ff4da (AG+GEMM's pulls from unmapped peers first): every op on the remote path
# (TILESCALE_NODE_SIZE) at 2 ranks (k=1) and 4 ranks (k=2), ranks sharing the H100
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/f4; mkdir -p $D
export TILESCALE_TEST_LOG_DIR=$D/jobs
B=$(mktemp -d)
timeout 330 python3 -m pytest -p no:cacheprovider -v -rs --basetemp $B/r -m multigpu --ranks 4 tests/test_gpu_remote.py -k 4r-k2 > $D/r4.log 2>&1 &
timeout 330 python3 -m pytest -p no:cacheprovider -v -rs --basetemp $B/r2 -m multigpu --ranks 2 tests/test_gpu_remote.py > $D/r2.log 2>&1 &
wait; echo "done at ${SECONDS}s"
rm -rf $B
grep -a -h -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $D/r2.log $D/r4.log | grep -v INFO | tail -8
grep -a -h -E "OK: AGGemm|OK: remote path|gave up|Error:" $D/jobs/*.log 2>/dev/null | cut -c1-200 | sort | uniq | tail -12
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf f4.tgz f4
