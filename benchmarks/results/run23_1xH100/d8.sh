# run D8 (session 28): the loopback push kernel with its rank a constant (no nvshmem_my_pe() load before its
# first TMA load) vs the committed kernel (.bench-old = 33c1133), one after the other
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/d8; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
STEP_TIMEOUT=200 timeout 210 bash benchmarks/run_one_gpu.sh $D/new push > $D/new_steps.log 2>&1; echo "new rc=$? at ${SECONDS}s"
grep -a -E "^\||relative|Error|Traceback" $D/new/push.log | head -14
(cd .bench-old && PYTHONPATH="$PWD:$PYTHONPATH" STEP_TIMEOUT=150 timeout 160 bash benchmarks/run_one_gpu.sh $D/old push > $D/old_steps.log 2>&1; echo "old rc=$? at ${SECONDS}s")
grep -a -E "^\||relative|Error|Traceback" $D/old/push.log | head -14
