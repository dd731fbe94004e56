# run E4 (session 29): tree 4940af4: world size 1 (ws1, host, profile) with the split tail at world size 1 and the
# shipped table's H100 entries, then multi-rank correctness (ranks sharing the GPU)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/e4; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
STEP_TIMEOUT=160 timeout 170 bash benchmarks/run_one_gpu.sh $D/t ws1 > $D/ws1_steps.log 2>&1; echo "ws1 rc=$? at ${SECONDS}s"
grep -a -E "^\||Error|Traceback" $D/t/ws1.log | head -16
STEP_TIMEOUT=90 timeout 200 bash benchmarks/run_one_gpu.sh $D/t host,profile > $D/hp_steps.log 2>&1; echo "host,profile rc=$? at ${SECONDS}s"
grep -a -E "MET|MISSED|overhead|host cost" $D/t/host.log $D/t/profile.log | cut -c1-200 | head -16
export TILESCALE_TEST_LOG_DIR=$D/jobs
B=$(mktemp -d); L=$((588 - SECONDS))
run() { local name=$1; shift; ( timeout $L python3 -m pytest -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
E=examples/distributed
run s1 -m "gpu or multigpu" --ranks 1 tests/test_gemm_config.py -k split
run s2 -m multigpu --ranks 2 tests/test_gemm_config.py -k "split" $E/example_allgather_gemm.py
run s4 -m multigpu --ranks 4 tests/test_gemm_config.py -k split
wait
rm -rf $B
for f in $D/s1.log $D/s2.log $D/s4.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $f | grep -v INFO | tail -6; done
grep -a -h -E "OK:|Error:|gave up" $D/jobs/*.log 2>/dev/null | cut -c1-220 | sort | uniq | tail -14
echo "shm: $(ls /dev/shm | grep -c cuda.shm)"
cd $OUT && tar czf e4.tgz e4 && rm -rf e4/jobs e4/t/profile
