# run J9 (session 33): what the persistent push kernel's epilogue costs: the loopback kernel with parts removed
# (.device/probe/diag.py; wrong results, timing only) vs cuBLAS and the flat loop alone
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/j9; mkdir -p $D
GPUS=1 timeout 300 bash launch.sh .device/probe/diag.py > $D/diag.log 2>&1; echo "diag rc=$? at ${SECONDS}s"
grep -a -E "^W=|Error|error|prebuild" $D/diag.log | head -20
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
