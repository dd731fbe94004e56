# run I1 (session 32): GEMM+RS's push kernel as a ring (the sum in loaded while the tile's GEMM runs), on one GPU:
# bench_gemm_configs --push for the new tree, then the same for the old tree (9de7753, the star kernel of run 26,
# in .bench-old), then GEMM+RS at world size 1 (bench_fused --op gemm_rs); each bounded
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/i1; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
GPUS=1 timeout 200 bash launch.sh benchmarks/bench_gemm_configs.py --push --json $D/push_new.json > $D/push_new.log 2>&1; echo "push new rc=$? at ${SECONDS}s"
grep -a -E "^\| [248] |Error|error" $D/push_new.log | head -12
( cd .bench-old && PYTHONPATH="$PWD:$PYTHONPATH" GPUS=1 timeout 200 bash launch.sh benchmarks/bench_gemm_configs.py --push --json $D/push_old.json > $D/push_old.log 2>&1; echo "push old rc=$? at ${SECONDS}s" )
grep -a -E "^\| [248] |Error|error" $D/push_old.log | head -12
L=$((585 - SECONDS))
GPUS=1 timeout $L bash launch.sh benchmarks/bench_fused.py --op gemm_rs --json $D/ws1_rs.json > $D/ws1_rs.log 2>&1; echo "ws1 rc=$? at ${SECONDS}s"
grep -a -E "^\||Error" $D/ws1_rs.log | head -8
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf i1.tgz i1
