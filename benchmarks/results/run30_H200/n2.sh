# run N2 (session 35): issue 15's table on commit 9f53ffa, one command: world size 1 (interleaved), host, profile,
# GEMM+RS's push kernel (the ring, loopback), build modes; each bounded
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/n2; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
STEP_TIMEOUT=165 timeout 575 bash benchmarks/run_one_gpu.sh $D/t ws1,host,profile,push,modes > $D/steps_out.log 2>&1; echo "steps rc=$? at ${SECONDS}s"
grep -a "^== " $D/t/steps.log
grep -a -E "^\|.*(AG\+GEMM|GEMM\+RS|MxKxN|[0-9]x[0-9])|interleaved timing" $D/t/ws1.log | head -16
grep -a -E "MET|MISSED|floor|back to back" $D/t/host.log $D/t/profile.log | cut -c1-200 | head -12
grep -a -E "^\| [248] " $D/t/push.log | head -10
grep -a -E "^(variant|tilelang|tilescale|inlined|rdc|cuBLAS|target|without)" $D/t/modes.log | head -12
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
rm -rf $D/t/profile/*.png
cd $OUT && tar czf n2.tgz n2
