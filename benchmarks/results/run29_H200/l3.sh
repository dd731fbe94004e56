# run L3 (session 34): GEMM+RS on 4 distinct GPUs: bench_fused --op gemm_rs for the tree of 7feacd0 (the push kernel with
# warp roles, persistent at any K) and the tree before (965338d, .bench-old: run 28's persistent kernel for short K,
# the step-by-step grid else), back to back; then GEMM+RS's example at 4 ranks, one per GPU (push and pull, bf16 and
# fp16, vs torch and NCCL, two shapes)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/l3; mkdir -p $D; export TILESCALE_TEST_LOG_DIR=$D/jobs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
GPUS=4 timeout 150 bash launch.sh benchmarks/bench_fused.py --op gemm_rs --json $D/new.json > $D/new.log 2>&1; echo "new rc=$? at ${SECONDS}s"
grep -a -E "^\||Error" $D/new.log | head -8
( cd .bench-old && PYTHONPATH="$PWD:$PYTHONPATH" GPUS=4 timeout 150 bash launch.sh benchmarks/bench_fused.py --op gemm_rs --json $D/old.json > $D/old.log 2>&1; echo "old rc=$? at ${SECONDS}s" )
grep -a -E "^\||Error" $D/old.log | head -8
L=$((450 - SECONDS))
B=$(mktemp -d)
timeout $L python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/t --ranks 4 examples/distributed/example_gemm_reducescatter.py > $D/t4.log 2>&1; echo "t4 rc=$? at ${SECONDS}s"
rm -rf $B
grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $D/t4.log | grep -v INFO | tail -4
grep -a -h -E "OK:|Error:" $D/jobs/*.log 2>/dev/null | cut -c1-180 | sort | uniq | tail -4
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf l3.tgz l3 && rm -rf l3/jobs
