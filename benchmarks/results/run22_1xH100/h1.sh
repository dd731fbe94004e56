# run H1 (session 27): issue 15's one-GPU table on one tree, in one command: build modes (with the new
# no-NVSHMEM-call variants), world size 1, host time, profiler overheads, GEMM+RS's push kernel
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/h1; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
STEP_TIMEOUT=170 timeout 560 bash benchmarks/run_one_gpu.sh $D/t modes,ws1,host,profile,push > $D/steps.log 2>&1; echo "steps rc=$? at ${SECONDS}s"
grep -a -E "^== |^\||^GEMM|^variant|^tilelang|^tilescale|^inlined|^rdc|^cuBLAS|target|floor|python|MET|MISSED" $D/steps.log | head -90
