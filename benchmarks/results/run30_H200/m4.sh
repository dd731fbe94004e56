# run M4 (session 35): the pushes (and the loads of the sums in) by plain 16-byte stores of three warps instead of bulk copies (timing only)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/m4; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
echo "ncu: $(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1 || echo none)"
GPUS=1 timeout 420 bash launch.sh .device/m1/run_m4.py > $D/run.log 2>&1; echo "m4 rc=$? at ${SECONDS}s"
grep -a -v "TileLang\|^\s*$" $D/run.log | tail -70
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
