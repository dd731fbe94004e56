# run F2 (session 30): tree 89506da: issue 15's world-size-1 table (ws1, host, profile: the profiler's record of an
# AllGather call now made by the runtime shim), the host-record probe, then the profiler's and AllGather's multi-rank
# tests at 2 ranks sharing the GPU
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/f2; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
STEP_TIMEOUT=160 timeout 170 bash benchmarks/run_one_gpu.sh $D/t ws1 > $D/ws1_steps.log 2>&1; echo "ws1 rc=$? at ${SECONDS}s"
grep -a -E "^\||Error|Traceback" $D/t/ws1.log | head -16
STEP_TIMEOUT=100 timeout 210 bash benchmarks/run_one_gpu.sh $D/t host,profile > $D/hp_steps.log 2>&1; echo "host,profile rc=$? at ${SECONDS}s"
grep -a -E "MET|MISSED|overhead|host cost|\| +AllGather 1 MiB/rank: op|floor" $D/t/host.log $D/t/profile.log | cut -c1-220 | head -20
GPUS=1 timeout 100 bash launch.sh benchmarks/probe_host_clock.py > $D/probe.log 2>&1; echo "probe rc=$? at ${SECONDS}s"
grep -a -E "us per call|vs off|clock source" $D/probe.log | head -12
export TILESCALE_TEST_LOG_DIR=$D/jobs
B=$(mktemp -d); L=$((585 - SECONDS))
timeout $L python3 -m pytest -p no:cacheprovider -v -rs --basetemp $B/p2 -m multigpu --ranks 2 tests/test_profiler.py examples/distributed/example_allgather.py > $D/p2.log 2>&1; echo "p2 rc=$? at ${SECONDS}s"
rm -rf $B
grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $D/p2.log | grep -v INFO | tail -8
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf f2.tgz f2 && rm -rf f2/jobs f2/t/profile
