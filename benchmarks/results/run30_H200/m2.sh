# run M2 (session 35): the push kernel with 2-CTA clusters, W multicast (timing only)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/m2; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
echo "ncu: $(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1 || echo none)"
GPUS=1 timeout 420 bash launch.sh .device/m1/run_m2.py > $D/run.log 2>&1; echo "m2 rc=$? at ${SECONDS}s"
grep -a -v "TileLang\|^\s*$" $D/run.log | tail -70
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
