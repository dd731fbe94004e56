# run D1 (session 28): GEMM+RS's push kernel with TMA reduce-adds into one slab (this tree) vs the slot kernel
# (.bench-old = 33c1133), the same machine, one after the other; signal_gpu: a diagnostic of the count's fence
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/d1; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
STEP_TIMEOUT=250 timeout 260 bash benchmarks/run_one_gpu.sh $D/new push > $D/new_steps.log 2>&1; echo "new rc=$? at ${SECONDS}s"
grep -a -E "^\||relative|Error|error" $D/new/push.log | head -30
L=$((570 - SECONDS))
(cd .bench-old && PYTHONPATH="$PWD:$PYTHONPATH" STEP_TIMEOUT=$((L - 10)) timeout $L bash benchmarks/run_one_gpu.sh $D/old push > $D/old_steps.log 2>&1; echo "old rc=$? at ${SECONDS}s")
grep -a -E "^\||relative|Error|error" $D/old/push.log | head -30
