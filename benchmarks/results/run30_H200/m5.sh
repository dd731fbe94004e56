# run M5 (session 35): long K: the old bulk push, the plain-store push, and warps 2-3 asleep at a named barrier (timing only)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/m5; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
GPUS=1 timeout 300 bash launch.sh .device/m1/run_m5.py > $D/run.log 2>&1; echo "m5 rc=$? at ${SECONDS}s"
grep -a -v "TileLang\|^\s*$" $D/run.log | tail -70
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
