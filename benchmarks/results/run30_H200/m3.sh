# run M3 (session 35): which of the sums warp's work slows the K loop (timing only)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/m3; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
echo "ncu: $(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1 || echo none)"
GPUS=1 timeout 420 bash launch.sh .device/m1/run_m3.py > $D/run.log 2>&1; echo "m3 rc=$? at ${SECONDS}s"
grep -a -v "TileLang\|^\s*$" $D/run.log | tail -70
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
# ncu: flat, the copy, noring (W = 8 8192x8192x1024), no clock control
GPUS=1 timeout 150 /usr/local/cuda/bin/ncu --target-processes all --clock-control none -k regex:gemm \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats bash launch.sh .device/m1/ncu_m3.py > $D/ncu.log 2>&1; echo "ncu rc=$? at ${SECONDS}s"
grep -a -E "^  [a-z_]+.*\(|Duration|Throughput|Busy|Pipe|Shared|L1/TEX Hit|L2 Hit|Issue|Eligible|Active Warps|Stall|Warp Cycles|ERR|rror" $D/ncu.log | head -150
