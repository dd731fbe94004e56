# run K7 (session 34): the persistent push kernel's phases by in-kernel clock stamps, and variants (timing only)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/k7; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
DIAG_OUT=$D GPUS=1 timeout 420 bash launch.sh .device/k7/run7.py > $D/run.log 2>&1; echo "stamps rc=$? at ${SECONDS}s"
grep -a -v "TileLang\|^\s*$" $D/run.log | tail -80
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
