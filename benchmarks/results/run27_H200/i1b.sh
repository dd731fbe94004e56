# run I1b (session 32; I1 failed on the new tree: the pull-tuned config did not fit with the sum in): GEMM+RS's push kernel as a ring (the sum in loaded while the tile's GEMM runs), on one GPU:
# bench_gemm_configs --push for the new tree, then the same for the old tree (9de7753, the star kernel of run 26,
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/i1b; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
GPUS=1 timeout 200 bash launch.sh benchmarks/bench_gemm_configs.py --push --json $D/push_new.json > $D/push_new.log 2>&1; echo "push new rc=$? at ${SECONDS}s"
grep -a -E "^\| [248] |Error|error" $D/push_new.log | head -12
( cd .bench-old && PYTHONPATH="$PWD:$PYTHONPATH" GPUS=1 timeout 200 bash launch.sh benchmarks/bench_gemm_configs.py --push --json $D/push_old.json > $D/push_old.log 2>&1; echo "push old rc=$? at ${SECONDS}s" )
grep -a -E "^\| [248] |Error|error" $D/push_old.log | head -12
L=$((585 - SECONDS))
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf i1b.tgz i1b
