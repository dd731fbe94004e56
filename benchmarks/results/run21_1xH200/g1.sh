# run G1 (session 26): GEMM+RS push path. 1) push kernel bench alone; 2) correctness at 2 and 4 ranks (shared GPU)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/g1; mkdir -p $D; export TILESCALE_TEST_LOG_DIR=$D/jobs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $D/gpu.txt 2>&1
STEP_TIMEOUT=250 timeout 260 bash benchmarks/run_one_gpu.sh $D/t push > $D/push_step.log 2>&1; echo "push rc=$? at ${SECONDS}s"
grep -a -E "^\||W=|Error|error" $D/t/push.log | tail -30
B=$(mktemp -d); L=$((570 - SECONDS))
run() { local name=$1; shift; ( timeout $L python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
E=examples/distributed
run r2 --ranks 2 $E/example_gemm_reducescatter.py
run r4 --ranks 4 $E/example_gemm_reducescatter.py
wait
rm -rf $B
for f in $D/r*.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|OK:|Error" $f | grep -v INFO | tail -8; done
for f in $D/jobs/*.log; do echo "== $f"; grep -a -E "OK:|Error|error|rank" $f | tail -6; done 2>/dev/null | tail -40
echo "shm: $(ls /dev/shm | grep -c cuda.shm)"
