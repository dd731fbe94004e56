# run E5 (session 29): is AG+GEMM 8192x1024x2752 at 2 ranks sharing the GPU failing on the tree before this session
# (f1a6ab7, .bench-old) too? Then the new tree again, with the kernel's launches made blocking
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/e6; mkdir -p $D
(cd .bench-old && PYTHONPATH="$PWD:$PYTHONPATH" GPUS=2 TILESCALE_RANKS_PER_GPU=2 timeout 200 bash launch.sh tests/gpu/ag_gemm_split_main.py > $D/old2.log 2>&1; echo "old tree, 2 ranks: rc=$? at ${SECONDS}s")
grep -a -E "OK:|Error|error|gave up" $D/old2.log | cut -c1-250 | head -8
# GPUS=2 TILESCALE_RANKS_PER_GPU=2 CUDA_LAUNCH_BLOCKING=1 timeout 200 bash launch.sh tests/gpu/ag_gemm_split_main.py > $D/new2.log 2>&1; echo "new tree, 2 ranks, blocking launches: rc=$? at ${SECONDS}s"
# grep -a -E "OK:|Error|error|gave up|File " $D/new2.log | cut -c1-250 | head -24
echo "shm: $(ls /dev/shm | grep -c cuda.shm)"
